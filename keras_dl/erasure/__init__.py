"""Retraining without erased rows (``keras-dl retrain-without``).

:mod:`.mark` tags every registered version that trained on the erased rows (found by
:func:`keras_dl.lineage.query.find_versions`) and finds the table version that removed them;
:mod:`.retrain` trains each affected version that holds an alias again from scratch, on the
table's current version with the config its run logged, through the recipe's registry gate, and
moves the alias only to a version that passed it; :mod:`.cli` is the command and its report.
"""
