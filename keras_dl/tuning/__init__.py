"""Hyperparameter search: ``keras-dl tune RECIPE`` and :func:`keras_dl.tune`.

- :mod:`~keras_dl.tuning.space`: the search space in the config language, parsed without eval;
- :mod:`~keras_dl.tuning.pruning`: the Keras callback that reports each epoch to Optuna;
- :mod:`~keras_dl.tuning.trial`: one trial, a nested MLflow run of ``fit``;
- :mod:`~keras_dl.tuning.study`: the study, its storage and the parent MLflow run;
- :mod:`~keras_dl.tuning.cli`: the ``keras-dl tune`` command.
"""
