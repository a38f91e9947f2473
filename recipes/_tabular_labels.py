"""The tabular recipe's labels: each label's task (classification or regression), its classes
or scale, its output head, its loss and metrics, and the label encoding run in tf.data.

One label gives one output; several (``data.label`` a list) give one head per label, keyed by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from keras_dl.config import Experiment
from keras_dl.errors import DataError

MAX_CLASSES = 1000


@dataclass(frozen=True)
class Target:
    """What ``prepare`` learned about the label: the task, the classes or the label's scale."""

    task: str
    classes: tuple = ()
    mean: float = 0.0
    std: float = 1.0


def compile_options(data, exp: Experiment, target: Target | dict[str, Target]) -> dict:
    """Loss and metrics for the task (per head, keyed by label, for several labels); on the
    chief, the run records the task and classes (JSON objects by label for several)."""
    import mlflow

    if isinstance(target, dict):
        if mlflow.active_run() is not None:  # only the chief has a run
            mlflow.set_tags(
                {
                    "keras_dl.task": json.dumps({k: t.task for k, t in target.items()}),
                    "keras_dl.classes": json.dumps({k: list(t.classes) for k, t in target.items()}),
                }
            )
        heads = {k: _loss_and_metrics(t) for k, t in target.items()}
        return {
            "loss": {k: loss for k, (loss, _) in heads.items()},
            "metrics": {k: metrics for k, (_, metrics) in heads.items()},
        }
    if mlflow.active_run() is not None:
        mlflow.set_tags({"keras_dl.task": target.task, "keras_dl.classes": _classes_tag(target)})
    loss, metrics = _loss_and_metrics(target)
    return {"loss": loss, "metrics": metrics}


def _loss_and_metrics(target: Target) -> tuple:
    import keras

    if target.task == "classification":
        return "sparse_categorical_crossentropy", ["accuracy"]
    return "mean_squared_error", [
        keras.metrics.MeanAbsoluteError(name="mae"),
        keras.metrics.RootMeanSquaredError(name="rmse"),
    ]


def make_head(x, target: Target, name: str | None = None):
    """The output layer for one label: softmax over its classes, or its rescaled value."""
    from keras import layers

    if target.task == "classification":
        return layers.Dense(len(target.classes), activation="softmax", dtype="float32", name=name)(
            x
        )
    # The network learns the standardized label; the output layer restores its scale.
    x = layers.Dense(1, dtype="float32")(x)
    return layers.Rescaling(scale=target.std, offset=target.mean, dtype="float32", name=name)(x)


def make_target(values: np.ndarray, arrow_type, task: str, label: str) -> Target:
    if task == "auto":
        task = "regression" if pa.types.is_floating(arrow_type) else "classification"
    if task == "regression":
        if values.dtype.kind not in "fiub":
            raise DataError(
                f"Label {label!r} is {arrow_type}, which cannot be a regression target. Set "
                "model.task=classification, or pick a numeric label."
            )
        values = values.astype(np.float64)
        return Target("regression", mean=float(values.mean()), std=float(values.std() or 1.0))
    classes = np.unique(values)
    if len(classes) > MAX_CLASSES:
        raise DataError(
            f"Label {label!r} has {len(classes)} distinct values, too many for classification "
            f"(at most {MAX_CLASSES}). For a numeric label set model.task=regression."
        )
    if len(classes) < 2:
        raise DataError(f"Label {label!r} has a single value {classes!r}: nothing to classify.")
    return Target(
        "classification", classes=tuple(c.item() if hasattr(c, "item") else c for c in classes)
    )


def make_label_table(target: Target):
    """A lookup from label value to class index, built once, outside the tf.data function."""
    import tensorflow as tf

    if target.task != "classification":
        return None
    keys = list(target.classes)
    if keys == list(range(len(keys))):
        return None  # already 0..K-1
    key_dtype = tf.string if isinstance(keys[0], str) else tf.int64
    keys = [int(k) for k in keys] if key_dtype == tf.int64 else keys
    init = tf.lookup.KeyValueTensorInitializer(
        tf.constant(keys, key_dtype), tf.range(len(keys), dtype=tf.int64)
    )
    return tf.lookup.StaticHashTable(init, default_value=-1)


def encode_labels(tables: dict, single: str | None, features, label):
    """Classes as integers (each head's, for several labels); features always as a dict keyed
    by column (one-column tables too)."""
    if single is not None and not isinstance(features, dict):
        features = {single: features}
    if isinstance(label, dict):
        return features, {k: _encode_label(tables[k], v) for k, v in label.items()}
    return features, _encode_label(next(iter(tables.values())), label)


def _encode_label(table, label):
    import tensorflow as tf

    if table is not None:
        if label.dtype != tf.string:
            label = tf.cast(label, tf.int64)
        label = table.lookup(label)
    elif label.dtype == tf.bool:
        label = tf.cast(label, tf.int64)
    return label


def _classes_tag(target: Target) -> str:
    return json.dumps(list(target.classes)) if target.task == "classification" else "[]"
