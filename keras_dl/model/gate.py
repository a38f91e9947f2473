"""The registry gate: only a model that earned it becomes a registered version.

:func:`keras_dl.run.finish.finish` calls :func:`decide` after the test evaluation and the model's
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
   checked against a trivial predictor (the ``keras_dl.model.gate`` tag says so);
3. ``registry.must_beat``, an alias such as ``champion``, when set: the version holding it is
   loaded, compiled with this model's loss and metrics and evaluated on the same rows, and this
   model must do better on the same metric (accuracy, MSE, or else the loss). When no version
   holds the alias yet, the model passes. A run on the changed rows (``data.since_version`` or
   ``data.since_timestamp``) is evaluated on those rows only, where a model that forgot the
   older rows can still win; so the model must also be no worse than the champion on the whole
   evaluation split at the same version (``data.full``, metrics ``full_test_*``), within
   ``registry.forgetting_tolerance`` of the champion's figure (relative). The champion's
   figures are logged as the run's ``champion_*`` metrics.

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
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from keras_dl.config import parse_min_metric
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.shard_epochs import iter_epoch_arrays
from keras_dl.errors import ConfigError
from keras_dl.model.champion import compare_on_rows, compare_on_whole_split, evaluate_champion
from keras_dl.model.score import Score, head_prefix, main_score

__all__ = ["Decision", "Score", "decide", "main_score"]

log = logging.getLogger(__name__)
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


@dataclass(frozen=True)
class Decision:
    """Whether the model may be registered.

    Attributes:
        passed: True when every check passed.
        reason: Why it may not (the first failed check); "" when it passed.
        checks: What was checked, one sentence each (the run's ``keras_dl.model.gate`` tag).
        metrics: Figures measured here, for the run: the champion's (``champion_test_*``,
            ``champion_full_test_*``) and, without a test split, the whole validation split's
            (``full_val_*``). Defaults to none.
    """

    passed: bool
    reason: str
    checks: tuple[str, ...]
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return "; ".join(self.checks)


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
    score_of = {h: main_score(model, scores, head_prefix(prefix, h), h) for h in heads}
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
    figures: dict[str, float] = {}
    if reg.must_beat and not refused:
        full = _full_evaluation(model, data, metrics)
        if data.full is not None and data.test is None:
            figures.update(full)  # the whole validation split's: finish logged no such figure
        splits = {prefix: split, **({data.full_prefix: data.full} if data.full else {})}
        champion = evaluate_champion(exp, model, data.plan, splits)
        figures.update(champion.metrics())
        for ok, text in compare_on_rows(champion, prefix, score_of):
            check(ok, text)
        if data.full is not None and champion.model is not None:
            for ok, text in compare_on_whole_split(exp, model, data, full, champion, heads):
                check(ok, text)
    return Decision(not refused, refused[0] if refused else "", tuple(checks), figures)


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


def _full_evaluation(model, data, metrics: Mapping[str, float]) -> dict[str, float]:
    """The model's metrics on the whole evaluation split (``data.full``): those ``finish``
    logged (``full_test_*``), else evaluated here (``full_val_*``); {} without one."""
    if data.full is None:
        return {}
    prefix = data.full_prefix
    logged = {k: v for k, v in metrics.items() if k.startswith(prefix)}
    if logged:
        return logged
    split = data.full
    got = model.evaluate(split.dataset, steps=split.steps, return_dict=True, verbose=0)
    return {f"{prefix}{k}": float(v) for k, v in got.items()}


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
