"""Row lineage: which registered model versions trained on a row (``keras-dl lineage``).

Every run logs a training manifest (:mod:`.record`): per split, the table's identity and the
exact rows read, as runs of physical row positions per file, and a fingerprint naming them.
:mod:`.query` walks the registry, follows warm starts (``model.init_from``) and counts, per
version and split, the trained rows a predicate or a list of row ids matches (:mod:`.matches`).
"""
