"""The Spark ML Params of :class:`~keras_dl.spark.KerasEstimator`, named as in Horovod's.

``horovod.spark.keras.KerasEstimator`` users move over by changing an import: the same Param
names (``feature_cols``, ``batch_size``, ...), the same camelCase getters and setters
(``getFeatureCols``, ``setBatchSize``), plus keras_dl's own ``experiment``,
``registered_model`` and ``strategy``. Each Param is a class attribute, so
``ParamGridBuilder().addGrid(est.epochs, [2, 4])`` works as for any Spark ML stage.
"""

from __future__ import annotations

from pyspark.ml.param import Param, Params, TypeConverters

from keras_dl.errors import ConfigError


def _to_validation(value):
    """A fraction in [0, 1) or a column name (rows where it is true or 1 validate)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
        return float(value)
    raise ConfigError(
        f"validation={value!r}: use a fraction in [0, 1) (e.g. 0.2) or the name of a column "
        "whose true/1 rows are the validation rows."
    )


def _to_cols(value):
    if isinstance(value, str):
        return [value]
    return TypeConverters.toListString(value)


def _to_weight_col(value):
    return None if value is None else TypeConverters.toString(value)


def _to_rate(value):
    """None (the default model's, or the optimizer's) or a positive learning rate."""
    if value is None:
        return None
    rate = TypeConverters.toFloat(value)
    if not rate > 0:
        raise ConfigError(f"learning_rate={value!r}: use a positive number, or None.")
    return rate


def _to_units(value):
    """None (the tabular recipe's (64, 32)) or the units of each hidden layer."""
    if value is None:
        return None
    units = TypeConverters.toListInt(value)
    if not units or min(units) < 1:
        raise ConfigError(f"hidden_units={value!r}: use positive layer widths, e.g. [64, 32].")
    return units


def _identity(value):
    return value


# (name, doc, converter, default). Defaults follow Horovod's where it has one.
SPECS = (
    ("model", "a keras.Model, compiled or not; each fit trains a clone of it", _identity, None),
    ("optimizer", "a Keras optimizer name or instance (copied for each fit)", _identity, None),
    ("loss", "a Keras loss name or instance", _identity, None),
    ("metrics", "Keras metrics (names or instances)", _identity, None),
    ("feature_cols", "feature columns: vectors, numeric arrays or numbers", _to_cols, None),
    ("label_cols", "the label column (one)", _to_cols, None),
    (
        "sample_weight_col",
        "a numeric column of per-row sample weights (data.weight_column)",
        _to_weight_col,
        None,
    ),
    ("validation", "validation fraction in [0, 1) or a true/1 column", _to_validation, None),
    ("batch_size", "global training batch size", TypeConverters.toInt, 32),
    ("val_batch_size", "batch size for validation and scoring", TypeConverters.toInt, None),
    ("epochs", "passes over the training rows", TypeConverters.toInt, 1),
    (
        "num_proc",
        "HorovodRunner np: 1 this process, -N local ranks, N Spark tasks",
        TypeConverters.toInt,
        1,
    ),
    ("store", "folder or URI for the materialized data, checkpoints and runs", _identity, None),
    ("callbacks", "extra Keras callbacks", _identity, None),
    (
        "random_seed",
        "seed for weights, shuffling and the validation split",
        TypeConverters.toInt,
        42,
    ),
    ("verbose", "Keras fit verbosity (0, 1 or 2)", TypeConverters.toInt, 0),
    ("run_id", "an MLflow run whose interrupted training to resume", _identity, None),
    (
        "experiment",
        "a keras_dl Experiment, its --set overrides, or an MLflow name",
        _identity,
        None,
    ),
    ("registered_model", "register the model under this name", _identity, None),
    (
        "strategy",
        "auto, none or mirrored (num_proc=1); horovod or multiworker (other num_proc)",
        TypeConverters.toString,
        "auto",
    ),
    (
        "learning_rate",
        "learning rate; None: the default model's, or the optimizer's",
        _to_rate,
        None,
    ),
    (
        "hidden_units",
        "hidden layer widths of the default model (no model given); None: (64, 32)",
        _to_units,
        None,
    ),
)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _accessors(name: str):
    def getter(self):
        return self.getOrDefault(getattr(self, name))

    def setter(self, value):
        return self._set(**{name: value})

    getter.__doc__ = f"The value of ``{name}``."
    setter.__doc__ = f"Set ``{name}``; returns the estimator."
    return getter, setter


class EstimatorParams(Params):
    """Every Param of the estimator, with ``getX``/``setX`` for each."""

    def _set_defaults(self) -> None:
        self._setDefault(**{name: default for name, _, _, default in SPECS})


for _name, _doc, _convert, _ in SPECS:
    setattr(EstimatorParams, _name, Param(Params._dummy(), _name, _doc, typeConverter=_convert))
    _get, _set = _accessors(_name)
    setattr(EstimatorParams, f"get{_camel(_name)}", _get)
    setattr(EstimatorParams, f"set{_camel(_name)}", _set)
