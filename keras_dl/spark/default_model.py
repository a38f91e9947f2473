"""The estimator without a model: the tabular recipe's network, sizing and early stopping.

``KerasEstimator(feature_cols=[...], label_cols=[...])`` with no ``model`` trains what
``python -m recipes.tabular`` trains on the materialized table: each feature value normalized
inside the model with its training mean and variance (NaN filled and flagged), hidden layers
with a linear path beside them, one softmax over the classes or one rescaled value, batch size
and epochs chosen from the training rows (:mod:`keras_dl.model.sizing`), and early stopping with the
best weights restored on a validation split (20 % of the rows, unless ``validation`` says
otherwise). Params that are set (``batch_size``, ``epochs``, ``learning_rate``,
``hidden_units``) are kept, as a ``--set`` is by the recipe.

The task comes from ``loss`` when it is given, else from the label: whole numbers from 0 to at
most ``MAX_CLASSES - 1`` (class indexes, as ``StringIndexer`` gives them) make a classifier,
anything else a regressor (pass ``loss="mse"`` to regress on whole numbers).
"""

from __future__ import annotations

import dataclasses

from keras_dl.errors import DataError
from keras_dl.spark import columns

MAX_CLASSES = 100
DEFAULT_VALIDATION = 0.2


def infer_task(df, label: str, loss) -> str:
    """MULTICLASS or REGRESSION for the default model: from ``loss``, else from the label.

    Raises:
        DataError: For class indexes with a gap (a class with no row), which the default
            model cannot map back to the index Spark ML's evaluators expect.
    """
    from pyspark.sql import functions as F

    y = columns._col(label).cast("double")
    stats = df.agg(
        F.min(y).alias("lo"),
        F.max(y).alias("hi"),
        F.sum((y != F.floor(y)).cast("long")).alias("frac"),
        F.countDistinct(y).alias("classes"),
    ).first()
    if loss is not None:
        task = columns.task_of(loss)
        task = columns.MULTICLASS if task == columns.BINARY else task
    elif stats["lo"] is None:
        return columns.REGRESSION  # no values: check_data names the nulls
    else:
        whole = not stats["frac"] and stats["lo"] >= 0 and stats["hi"] < MAX_CLASSES
        task = columns.MULTICLASS if whole else columns.REGRESSION
    if task == columns.MULTICLASS and stats["hi"] is not None:
        if not stats["frac"] and stats["classes"] != int(stats["hi"]) + 1:
            raise DataError(
                f"Label column {label!r} holds {stats['classes']} classes between 0 and "
                f"{stats['hi']:g}; the default model takes class indexes 0 to K-1, each with "
                "rows. Index the labels with StringIndexer."
            )
    return task


def tabular_experiment(exp, task: str, sizes_set: dict, learning_rate, hidden):
    """``exp`` (the estimator's Experiment) as a run of the tabular recipe.

    ``sizes_set`` holds the batch size and epochs the user set (others are chosen from the rows).
    """
    from keras_dl.recipe import load_recipe

    defaults = load_recipe("tabular").defaults
    model = exp.model if isinstance(exp.model, type(defaults.model)) else defaults.model
    model = dataclasses.replace(
        model,
        task="classification" if task == columns.MULTICLASS else "regression",
        **({"hidden": tuple(hidden)} if hidden else {}),
    )
    train = dataclasses.replace(
        exp.train,
        batch_size=sizes_set.get("batch_size"),
        epochs=sizes_set.get("epochs"),
        learning_rate=learning_rate or defaults.train.learning_rate,
    )
    data = dataclasses.replace(exp.data, pack_features=True)
    return dataclasses.replace(exp, recipe="tabular", model=model, train=train, data=data)


def train_default(exp, callbacks=(), run_id: str | None = None):
    """Train the tabular recipe in this process; the MLflow run id and the trained model."""
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    result = fit(exp, load_recipe("tabular"), callbacks=callbacks, run_id=run_id)
    return result.run_id, result.model


def single_input(model, width: int):
    """The trained model (keyed by the materialized features column) as a model of one
    ``(width,)`` float input, as :class:`~keras_dl.spark.KerasModel` scores it."""
    import keras

    inp = keras.Input((width,), name=columns.FEATURES)
    return keras.Model(inp, model({columns.FEATURES: inp}), name="keras_dl_tabular")
