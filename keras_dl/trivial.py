"""The trivial predictor's training loss: what a model that learned nothing would score.

A training loss orders of magnitude above it means the model is worse than knowing nothing:
``keras_dl.train`` fails such a run as diverged (``callbacks.trivial_loss_factor``), which
catches a start that explodes and then falls (``train.learning_rate=1e6``: 1.8e20 at epoch 1),
where the growth rule (``callbacks.divergence_factor``) never trips.

The trivial predictor is fitted on the training split's labels and scored on the same rows,
for the losses the recipes compile:

- cross-entropy (sparse, categorical, binary): predicting the training class frequencies, a
  loss of their entropy;
- mean squared or absolute error: predicting the training labels' mean.

The rule compares with the larger of that loss and an uninformed output's (uniform over the
model's K outputs, ln K; or predicting 0 for regression), the loss a fresh model starts near:
a very skewed label's entropy, or the MSE around a mean far from 0, can be far below a healthy
first epoch. For balanced classes the two coincide (digits: 2.302 and ln 10 = 2.303); the
entropy is never above ln K, so for cross-entropy the larger is ln K, and for MSE the mean's
loss is never above predicting 0's: the class counts and the mean give the figure reported
beside it, and the margin the skew or offset takes off the rule. Both figures are in the run
(params ``divergence.trivial_loss`` and ``divergence.trivial_loss_basis``). Rows weigh as in
training (``data.weight_column`` and ``train.class_weight``). Another loss (a custom one, label
smoothing) has no trivial figure here: :func:`trivial_loss` says so and the rule is skipped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from keras_dl.data.stream.blocks import WEIGHT
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.shard_epochs import iter_epoch_arrays

log = logging.getLogger(__name__)
CROSS_ENTROPY = ("sparse_categorical_crossentropy", "categorical_crossentropy")
BINARY = ("binary_crossentropy",)
SQUARED = ("mse", "mean_squared_error")
ABSOLUTE = ("mae", "mean_absolute_error")


@dataclass(frozen=True)
class TrivialLoss:
    """The trivial predictor's training loss, or why there is none.

    Attributes:
        value: The loss, or None when it is not known for this model's loss.
        what: What the trivial predictor does, or why there is no figure (for messages).
    """

    value: float | None
    what: str
    predictor: float | None = None  # the trivial predictor's own loss
    uninformed: float | None = None  # an uninformed output's loss


def run_trivial_loss(factor: float, model, data) -> TrivialLoss | None:
    """The training split's trivial loss for a run, or None when ``factor``
    (``callbacks.trivial_loss_factor``) is 0 or the data has no label; warns when it is
    unknown for the model's loss (the rule is then skipped).

    Args:
        factor: ``callbacks.trivial_loss_factor``.
        model: The compiled Keras model.
        data: The run's :class:`~keras_dl.data.splits.DataSplits`.
    """
    if factor == 0 or data.plan.label is None:
        return None
    got = trivial_loss(model, data.train, data.plan)
    if got.value is None:
        log.warning("callbacks.trivial_loss_factor is not checked: %s.", got.what)
    return got


def trivial_params(trivial: TrivialLoss | None) -> dict:
    """The run's params for ``trivial``: the figure compared (or "unknown") and its basis."""
    if trivial is None:
        return {}
    value = "unknown" if trivial.value is None else f"{trivial.value:.6g}"
    return {"divergence.trivial_loss": value, "divergence.trivial_loss_basis": trivial.what}


def trivial_loss(model, split, plan: ColumnPlan) -> TrivialLoss:
    """The trivial predictor's loss on ``split`` (the training split), for ``model``'s loss.

    Args:
        model: The compiled Keras model (its ``loss``, ``loss_weights`` and output widths).
        split: The training :class:`~keras_dl.data.stream.tfdata.SplitData` (its snapshot is read).
        plan: The run's column plan (labels, weight column, class weights).
    """
    heads = [s.name for s in plan.labels] if plan.heads else [None]
    losses, weights = model.loss, getattr(model, "loss_weights", None)
    kinds = {}
    for head in heads:
        loss = losses.get(head) if head and isinstance(losses, Mapping) else losses
        kinds[head] = loss_name(loss)
        if kinds[head] is None:
            where = f" (head {head!r})" if head else ""
            return TrivialLoss(None, f"no trivial loss is known for loss {_describe(loss)}{where}")
    if plan.label is None:
        return TrivialLoss(None, "the data has no label")
    labels, row_weights = read_labels(split, plan)
    total, whats, parts = 0.0, [], []
    for i, head in enumerate(heads):
        name = head or plan.label.name
        got = loss_of_trivial(kinds[head], labels[name], row_weights, _width(model, i))
        factor = _weight(weights, head, i)
        total += factor * got.value
        parts.append((factor * got.predictor, factor * got.uninformed))
        whats.append(f"{head}: {got.what}" if head else got.what)
    predictor, uninformed = (sum(p) for p in zip(*parts))
    return TrivialLoss(total, "; ".join(whats), predictor, uninformed)


def loss_of_trivial(
    kind: str, labels: np.ndarray, weights: np.ndarray | None = None, width: int | None = None
) -> TrivialLoss:
    """The mean loss ``kind`` of the trivial predictor fitted on ``labels``, on those rows.

    Args:
        kind: A name from :func:`loss_name`.
        labels: One label per row (class values, one-hot rows or numbers).
        weights: Each row's weight (the training loss's). Defaults to None (all 1).
        width: The model's output width (classes, for the uniform floor). Defaults to None.

    Returns:
        The :class:`TrivialLoss`: its ``value`` is the larger of ``predictor`` and
        ``uninformed``.
    """
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    frequencies = "predicting the training class frequencies"
    if kind in CROSS_ENTROPY:
        onehot = _one_hot(labels) if kind == "sparse_categorical_crossentropy" else labels
        onehot = np.asarray(onehot, np.float64).reshape(len(labels), -1)
        p = onehot.mean(axis=0)
        per_row = -(onehot * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        uniform = np.log(max(onehot.shape[1], width or 0, 2))  # a row's loss, any row
        return _floor(per_row, w, _mean(np.full(len(w), uniform), w), frequencies)
    y = np.asarray(labels, np.float64).reshape(len(labels), -1)
    if kind in BINARY:
        p = np.clip(y.mean(axis=0), 1e-7, 1 - 1e-7)
        per_row = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(axis=1)
        return _floor(per_row, w, _mean(np.full(len(w), np.log(2)), w), frequencies)
    mean = y.mean(axis=0)
    if kind in SQUARED:
        per_row, zero = ((y - mean) ** 2).mean(axis=1), (y**2).mean(axis=1)
    else:
        per_row, zero = np.abs(y - mean).mean(axis=1), np.abs(y).mean(axis=1)
    return _floor(per_row, w, _mean(zero, w), "predicting the training mean")


def loss_name(loss) -> str | None:
    """The name of a loss this module knows (a string, a Keras loss or loss function), or None.

    Label smoothing changes what the trivial predictor scores: such a loss is not known. A loss
    wrapped to leave padding out (``inner``) is named by the loss it wraps."""
    loss = getattr(loss, "inner", loss)
    if getattr(loss, "label_smoothing", 0) or getattr(loss, "_fn_kwargs", {}).get(
        "label_smoothing"
    ):
        return None
    name = loss if isinstance(loss, str) else getattr(loss, "name", None)
    name = name or getattr(loss, "__name__", None)
    known = (*CROSS_ENTROPY, *BINARY, *SQUARED, *ABSOLUTE)
    return name if name in known else None


def read_labels(split, plan: ColumnPlan) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every value of each label of ``plan`` in ``split``, and each row's sample weight as
    training weighs it (weight column times class weight; 1 without either), read from the
    split's snapshot as training reads it."""
    plan = dataclasses.replace(plan, features=())
    labels: dict[str, list] = {s.name: [] for s in plan.labels}
    weights = []
    for chunk in iter_epoch_arrays(split.snapshot, plan, split.stats, seed=None):
        for name, values in labels.items():
            values.append(chunk[name])
        rows = len(chunk[plan.label.name])
        weights.append(chunk[WEIGHT] if WEIGHT in chunk else np.ones(rows))
    if not weights:
        return {name: np.array([]) for name in labels}, np.array([])
    arrays = {name: np.concatenate(values) for name, values in labels.items()}
    return arrays, np.concatenate(weights).astype(np.float64)


def _floor(per_row, w, uninformed: float, what: str) -> TrivialLoss:
    value, uninformed = _mean(per_row, w), float(uninformed)
    text = f"{what} scores {value:.4g}, an uninformed output {uninformed:.4g}"
    return TrivialLoss(max(value, uninformed), text, value, uninformed)


def _mean(per_row, w) -> float:
    return float(np.sum(per_row * w) / max(len(per_row), 1))  # Keras: mean of weighted losses


def _one_hot(labels: np.ndarray) -> np.ndarray:
    _, index = np.unique(labels, return_inverse=True)
    return np.eye(index.max() + 1 if len(index) else 1)[index.reshape(-1)]


def _width(model, index: int) -> int | None:
    try:
        return int(model.outputs[index].shape[-1])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def _weight(weights, head, index: int) -> float:
    if weights is None:
        return 1.0
    if isinstance(weights, Mapping):
        return float(weights.get(head, 1.0))
    return float(weights[index])


def _describe(loss) -> str:
    if isinstance(loss, str):
        return repr(loss)
    return repr(getattr(loss, "name", None) or getattr(loss, "__name__", type(loss).__name__))
