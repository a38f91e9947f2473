"""A model's home: how it is logged, judged and registered.

- ``log`` writes the model folder (its flavor, and ``pyfunc``, the loader shipped in ``code/``);
  ``publish`` logs a trained model to the run with its signature and registers a version;
- ``score``, ``champion`` and ``gate``: the metric compared, the alias holder evaluated on the
  same rows, and the gate that decides whether a model earned registration;
- ``registry`` promotes a version to an alias; ``warm_start`` starts from a registered model;
- ``sizing`` chooses batch size and epochs from the table's size.
"""
