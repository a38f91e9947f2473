"""What ``model.fit`` receives from a split: ``features``, ``(features, label)`` or
``(features, label, sample_weight)``, built from ``{column: array}`` dicts, and its TensorSpecs.

Several labels (one output head each) are a dict keyed by label column, the model's output
names; the one sample weight applies to every head."""

from __future__ import annotations

from keras_dl.data.stream.blocks import WEIGHT
from keras_dl.data.stream.features import NUMERIC, ColumnPlan, FeatureSpec


def to_structure(values: dict, plan: ColumnPlan):
    """(features, label[, weight]): one feature (or label) is a bare tensor, several a dict by
    column; a packed feature is always in a dict, by its name (``__packed_<dtype>``)."""
    if len(plan.features) == 1 and not plan.features[0].members:
        features = values[plan.features[0].name]
    else:
        features = {f.name: values[f.name] for f in plan.features}
    if plan.label is None:
        return features
    if plan.heads:
        label = {s.name: values[s.name] for s in plan.labels}
    else:
        label = values[plan.label.name]
    if WEIGHT in values:
        return features, label, values[WEIGHT]
    return features, label


def input_signature(plan: ColumnPlan, blocked: bool = False, weighted: bool = False):
    """The TensorSpecs of :func:`to_structure`'s output, per batch or (``blocked``) per block."""
    import tensorflow as tf

    specs = {s.name: tensor_spec(s, blocked) for s in plan.specs}
    if weighted and plan.label is not None:
        specs[WEIGHT] = tf.TensorSpec((None, None) if blocked else (None,), tf.float32)
    return to_structure(specs, plan)


def tensor_spec(spec: FeatureSpec, blocked: bool = False):
    """A column's batches, ``(None, ...)``; ``blocked``: blocks of batches, ``(None, None, ...)``."""
    import tensorflow as tf

    dtype = tf.as_dtype(spec.dtype) if spec.kind == NUMERIC else tf.string
    return tf.TensorSpec(shape=(None, *([None] if blocked else []), *spec.shape), dtype=dtype)
