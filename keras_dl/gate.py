"""The registry gate: only a model that earned it becomes a registered version.

:func:`keras_dl.finish.finish` calls :func:`decide` after the test evaluation and the model's
logging, before it registers the model. The model's evaluation metrics are its test metrics
(``test_*``), or, without a test split, the validation split's (``val_*``, evaluated here).
The model must pass, in this order:

1. ``registry.min_metric``, a floor such as ``test_accuracy>=0.95``, when set;
2. the trivial predictor on the same evaluation rows, always. The task comes from the compiled
   metrics and loss: an accuracy metric (``accuracy``, ``acc``, ``sparse_categorical_accuracy``,
   ``categorical_accuracy``, ``binary_accuracy``) means classification, and the model's
   accuracy must be higher than that of always predicting the training split's majority class
   (on a tie, the tied class that scores best on the evaluation rows); else an MSE or RMSE
   metric, or a mean-squared-error loss, means regression, and the model's MSE must be lower
   than that of always predicting the training labels' mean. A model with neither is not
   checked against a trivial predictor (the ``keras_dl.gate`` tag says so);
3. ``registry.must_beat``, an alias such as ``champion``, when set: the version holding it is
   loaded, compiled with this model's loss and metrics and evaluated on the same rows, and this
   model must do better on the same metric (accuracy, MSE, or else the loss). When no version
   holds the alias yet, the model passes.

A model with several labels (one output head each, metrics named ``test_<label>_<metric>``) is
judged head by head: every head must beat its own trivial predictor (on its own label column)
and, with ``registry.must_beat``, the champion's same head on the same metric; one head that
does not refuses the model, and the reason names it.

The baselines read the label column of the split snapshots training read, through the same
reader. A recipe may map labels to class indices in its preprocessing (the tabular recipe does,
for string labels); a one-to-one mapping does not change which predictions are right, so the
majority class's accuracy in the table's labels is its accuracy in the model's.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from keras_dl.config import parse_min_metric
from keras_dl.data.features import ColumnPlan
from keras_dl.data.reader import iter_epoch_arrays
from keras_dl.errors import ConfigError
from keras_dl.frame_model import packed_input_model
from keras_dl.registry import load_keras_model

log = logging.getLogger(__name__)
TIE_TOLERANCE = 1e-6  # relative: float32 metrics carry about 7 significant digits

ACCURACY = (
    "accuracy",
    "acc",
    "sparse_categorical_accuracy",
    "categorical_accuracy",
    "binary_accuracy",
)
MSE = ("mse", "mean_squared_error")
RMSE = ("rmse", "root_mean_squared_error")
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


@dataclass(frozen=True)
class Decision:
    """Whether the model may be registered.

    Attributes:
        passed: True when every check passed.
        reason: Why it may not (the first failed check); "" when it passed.
        checks: What was checked, one sentence each (the run's ``keras_dl.gate`` tag).
    """

    passed: bool
    reason: str
    checks: tuple[str, ...]

    @property
    def summary(self) -> str:
        return "; ".join(self.checks)


@dataclass(frozen=True)
class Score:
    """The metric the gate compares: its name, value, direction and the task it implies."""

    name: str
    value: float
    higher_is_better: bool
    task: str | None  # "classification", "regression", or None (the loss of another task)

    def beats(self, other: float) -> bool:
        """Strictly better than ``other``. Keras reports metrics in float32, so a score within
        float32 rounding of ``other`` ties, and a tie does not beat: a model that collapsed to
        the majority class scores 37/360 as 0.10277778, above the exact 0.10277777..."""
        if math.isclose(self.value, other, rel_tol=TIE_TOLERANCE):
            return False
        return self.value > other if self.higher_is_better else self.value < other


def decide(exp, model, data, metrics: Mapping[str, float]) -> Decision:
    """Check the trained ``model`` against ``exp.registry`` and the trivial predictor.

    Args:
        exp: The resolved experiment (``registry``, ``tracking.registered_model``).
        model: The trained, compiled Keras model.
        data: The run's :class:`~keras_dl.data.splits.DataSplits`.
        metrics: The test metrics ``finish`` logged (``test_*``).

    Returns:
        The :class:`Decision`.

    Raises:
        ConfigError: ``registry.min_metric`` names a metric the run does not have.
    """
    reg = exp.registry
    split, prefix, scores = _evaluation(model, data, metrics)
    checks: list[str] = []
    refused: list[str] = []

    def check(ok: bool, text: str) -> None:
        checks.append(text)
        if not ok:
            refused.append(text)

    if reg.min_metric:
        name, op, floor = parse_min_metric(reg.min_metric)
        if name not in scores:
            have = ", ".join(sorted(scores)) or "none (no test or validation split)"
            raise ConfigError(
                f"registry.min_metric={reg.min_metric!r} names {name!r}, which this run does not "
                f"have. Its evaluation metrics: {have}. Set it to one of them and run again: "
                "the trained model is kept, nothing trains again."
            )
        ok = _OPS[op](scores[name], floor)
        check(ok, f"{name}={scores[name]:.4g} {'meets' if ok else 'fails'} {name}{op}{floor:g}")
    if split is None:
        checks.append("no test or validation split: not compared with a trivial predictor")
        if reg.must_beat:
            check(False, f"no test or validation split to compare with @{reg.must_beat} on")
        return Decision(not refused, refused[0] if refused else "", tuple(checks))
    heads = _heads(data.plan)
    score_of = {h: main_score(model, scores, _head_prefix(prefix, h), h) for h in heads}
    for head, score in score_of.items():
        where = f"head {head!r}: " if head else ""
        if score is None or score.task is None:
            checks.append(
                f"{where}no accuracy or MSE metric: not compared with a trivial predictor"
            )
            continue
        spec = _label_spec(data.plan, head)
        ok, text = _against_trivial(score, _labels(data.train, spec), _labels(split, spec))
        check(ok, where + text)
    if reg.must_beat and not refused:
        for ok, text in _against_champion(exp, model, split, prefix, score_of, data.plan):
            check(ok, text)
    return Decision(not refused, refused[0] if refused else "", tuple(checks))


def main_score(
    model, scores: Mapping[str, float], prefix: str, head: str | None = None
) -> Score | None:
    """The metric the gate compares: accuracy (classification), MSE (regression), else the loss.

    Args:
        model: The compiled model (its loss tells a mean-squared-error regression apart).
        scores: One split's metrics, each named ``prefix`` + the compiled name.
        prefix: "test_" or "val_" (with the head's label for several heads: "test_price_").
        head: The output head (label) whose loss to look at, for several heads. Defaults to
            None (one output).
    """
    for name in ACCURACY:
        if prefix + name in scores:
            return Score(prefix + name, scores[prefix + name], True, "classification")
    for name in MSE:
        if prefix + name in scores:
            return Score(prefix + name, scores[prefix + name], False, "regression")
    for name in RMSE:
        if prefix + name in scores:
            value = scores[prefix + name] ** 2
            return Score(f"{prefix}{name}^2", value, False, "regression")
    if prefix + "loss" not in scores:
        return None
    loss = getattr(model, "loss", None)
    if head is not None and isinstance(loss, Mapping):
        loss = loss.get(head)
    if loss in MSE or type(loss).__name__ == "MeanSquaredError":
        return Score(f"{prefix}loss (MSE)", scores[prefix + "loss"], False, "regression")
    return Score(prefix + "loss", scores[prefix + "loss"], False, None)


def _evaluation(model, data, metrics: Mapping[str, float]):
    """The evaluation split, its metrics' prefix and its metrics: the test split's (as
    ``finish`` logged them), else the validation split's (evaluated here)."""
    if data.test is not None:
        return data.test, "test_", {k: v for k, v in metrics.items() if k.startswith("test_")}
    if data.validation is not None:
        split = data.validation
        got = model.evaluate(split.dataset, steps=split.steps, return_dict=True, verbose=0)
        return split, "val_", {f"val_{k}": float(v) for k, v in got.items()}
    return None, "", {}


def _heads(plan: ColumnPlan) -> list[str | None]:
    """The output heads to judge: each label's name for several, else [None] (one output)."""
    return [s.name for s in plan.labels] if plan.heads else [None]


def _head_prefix(prefix: str, head: str | None) -> str:
    """Keras names a head's metrics after its output: ``val_`` + ``price_`` + ``mae``."""
    return f"{prefix}{head}_" if head else prefix


def _label_spec(plan: ColumnPlan, head: str | None):
    return plan.label if head is None else next(s for s in plan.labels if s.name == head)


def _labels(split, spec) -> np.ndarray:
    """Every value of label ``spec`` in ``split``, read from its snapshot as training reads it."""
    plan = ColumnPlan(features=(), labels=(spec,))
    chunks = [
        c[plan.label.name] for c in iter_epoch_arrays(split.snapshot, plan, split.stats, seed=None)
    ]
    return np.concatenate(chunks) if chunks else np.array([])


def _against_trivial(score: Score, train: np.ndarray, rows: np.ndarray) -> tuple[bool, str]:
    """Compare ``score`` with the trivial predictor fitted on ``train``, scored on ``rows``."""
    n = len(rows)
    if score.task == "classification":
        train, rows = _rows(train), _rows(rows)
        values, counts = np.unique(train, axis=0 if train.ndim > 1 else None, return_counts=True)
        majority = values[counts == counts.max()]
        hits = [_hits(rows, v) for v in majority]
        best = int(np.argmax(hits))
        baseline, label = hits[best] / max(n, 1), _text(majority[best])
        what = f"the training majority class {label} ({baseline:.4g})"
    else:
        mean = train.astype(np.float64).mean(axis=0)
        baseline = float(np.mean((rows.astype(np.float64) - mean) ** 2))
        what = f"predicting the training mean {_text(mean)} (MSE {baseline:.4g})"
    ok = score.beats(baseline)
    verb = "beats" if ok else "does not beat"
    return ok, f"{score.name}={score.value:.4g} {verb} {what} on the same {n} rows"


def _against_champion(
    exp, model, split, prefix: str, score_of: dict, plan: ColumnPlan
) -> list[tuple[bool, str]]:
    """Evaluate the holder of ``registry.must_beat`` on ``split``; compare the main metric of
    each head (``score_of``: head, or None for one output, to this model's score)."""
    import mlflow

    name, alias = exp.tracking.registered_model, exp.registry.must_beat
    client = mlflow.MlflowClient()
    try:
        version = client.get_registered_model(name).aliases.get(alias)
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        version = None
    if version is None:
        return [(True, f"no version of {name!r} holds @{alias} yet: nothing to beat")]
    try:
        # A logged model takes named columns: fed the split's packed features split up.
        champion = packed_input_model(load_keras_model(f"models:/{name}/{version}"), plan)
        _compile_like(champion, model)
        got = champion.evaluate(split.dataset, steps=split.steps, return_dict=True, verbose=0)
    except Exception as exc:
        return [
            (
                False,
                f"{name}@{alias} (version {version}) could not be evaluated on these rows "
                f"({type(exc).__name__}: {exc}); promote a version by hand or drop "
                "registry.must_beat",
            )
        ]
    got = {f"{prefix}{k}": float(v) for k, v in got.items()}
    out = []
    for head, score in score_of.items():
        theirs = main_score(champion, got, _head_prefix(prefix, head), head)
        if score is None or theirs is None:
            where = f" on head {head!r}" if head else ""
            text = f"no common metric{where} to compare with {name}@{alias} (version {version})"
            out.append((False, text))
            continue
        ok = score.beats(theirs.value)
        verb = "beats" if ok else "does not beat"
        out.append(
            (
                ok,
                f"{score.name}={score.value:.4g} {verb} {name}@{alias} (version {version}): "
                f"{theirs.value:.4g} on the same rows",
            )
        )
    return out


def _compile_like(champion, model) -> None:
    """Compile ``champion`` with ``model``'s loss and metrics, so both report the same names."""
    import keras

    config = model.get_compile_config() or {}
    keys = ("loss", "loss_weights", "metrics", "weighted_metrics")
    kept = {k: config[k] for k in keys if config.get(k) is not None}
    champion.compile(**keras.saving.deserialize_keras_object(kept))


def _rows(labels: np.ndarray) -> np.ndarray:
    """Labels as one value per row, or one flat vector per row (one-hot or multi-dimensional)."""
    return labels.reshape(len(labels), -1) if labels.ndim > 1 else labels


def _hits(rows: np.ndarray, value) -> int:
    """Rows whose label equals ``value`` (a whole vector for vector labels)."""
    equal = rows == value
    return int(equal.all(axis=1).sum() if equal.ndim > 1 else equal.sum())


def _text(value) -> str:
    value = np.asarray(value)
    if value.ndim == 0:
        item = value.item()
        if isinstance(item, float):
            return f"{item:.4g}"
        return repr(item.decode() if isinstance(item, bytes) else item)
    return np.array2string(value, precision=4, threshold=8)
