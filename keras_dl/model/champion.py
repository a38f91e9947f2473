"""The other side of ``registry.must_beat``: the version holding the alias, evaluated on the
run's own rows.

:mod:`keras_dl.model.gate` compares its figures with the new model's. The champion is loaded from
the registry, compiled with the new model's loss and metrics (so both report the same names)
and evaluated on each split the gate names: the evaluation rows, and for a run on the changed
rows (``data.since_version``) the whole test split as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keras_dl import tracking
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.model.log import packed_input_model
from keras_dl.model.registry import load_keras_model
from keras_dl.model.score import head_prefix, main_score


@dataclass(frozen=True)
class Champion:
    """The holder of ``registry.must_beat`` and its metrics.

    Attributes:
        name: The registered model.
        alias: The alias (``registry.must_beat``).
        version: The version holding it, or None when none does yet.
        scores: Its metrics, each named by the split's prefix (``test_loss``,
            ``full_test_loss``), as the new model's are.
        model: The loaded, compiled champion (None when there is none or it failed).
        error: Why it could not be evaluated ("" when it was).
    """

    name: str
    alias: str
    version: str | None
    scores: dict[str, float] = field(default_factory=dict)
    model: Any = None
    error: str = ""

    @property
    def label(self) -> str:
        """``NAME@ALIAS (version N)``, as the gate's sentences name it."""
        return f"{self.name}@{self.alias} (version {self.version})"

    def metrics(self) -> dict[str, float]:
        """Its scores as the run's metrics: ``champion_`` + the name (``champion_test_loss``)."""
        return {f"champion_{k}": v for k, v in self.scores.items()}


def evaluate_champion(exp, model, plan: ColumnPlan, splits: Mapping[str, Any]) -> Champion:
    """Load the version holding ``registry.must_beat`` and evaluate it on ``splits``.

    Args:
        exp: The experiment (``tracking.registered_model``, ``registry.must_beat``).
        model: The new, compiled model: the champion is compiled with its loss and metrics.
        plan: The run's column plan (a logged model takes named columns; packed features are
            fed to it split up).
        splits: Metric prefix to split, e.g. ``{"test_": data.test, "full_test_": data.full}``.

    Returns:
        The :class:`Champion`; its ``error`` says why it could not be evaluated (a failed load
        or evaluation does not raise: the gate refuses the model with that reason).
    """
    name, alias = exp.tracking.registered_model, exp.registry.must_beat
    version = _version_of(tracking.client(), name, alias)
    if version is None:
        return Champion(name, alias, None)
    scores = {}
    try:
        champion = packed_input_model(load_keras_model(f"models:/{name}/{version}"), plan)
        _compile_like(champion, model)
        for prefix, split in splits.items():
            got = champion.evaluate(split.dataset, steps=split.steps, return_dict=True, verbose=0)
            scores.update({f"{prefix}{k}": float(v) for k, v in got.items()})
    except Exception as exc:
        return Champion(name, alias, version, scores, error=f"{type(exc).__name__}: {exc}")
    return Champion(name, alias, version, scores, champion)


def compare_on_rows(champion: Champion, prefix: str, score_of: dict) -> list[tuple[bool, str]]:
    """Compare the main metric of each head (``score_of``: head, or None for one output, to
    this model's score) with the champion's on the evaluation rows."""
    if champion.version is None:
        text = f"no version of {champion.name!r} holds @{champion.alias} yet: nothing to beat"
        return [(True, text)]
    if champion.error:
        return [
            (
                False,
                f"{champion.label} could not be evaluated on these rows ({champion.error}); "
                "promote a version by hand or drop registry.must_beat",
            )
        ]
    out = []
    for head, score in score_of.items():
        theirs = main_score(champion.model, champion.scores, head_prefix(prefix, head), head)
        if score is None or theirs is None:
            where = f" on head {head!r}" if head else ""
            out.append((False, f"no common metric{where} to compare with {champion.label}"))
            continue
        ok = score.beats(theirs.value)
        verb = "beats" if ok else "does not beat"
        out.append(
            (
                ok,
                f"{score.name}={score.value:.4g} {verb} {champion.label}: {theirs.value:.4g} on "
                "the same rows",
            )
        )
    return out


def compare_on_whole_split(exp, model, data, full: dict, champion: Champion, heads) -> list:
    """Compare each head's main metric on the whole evaluation split (``full``: this model's
    metrics there) with the champion's: no worse, within ``registry.forgetting_tolerance``."""
    tolerance, rows = exp.registry.forgetting_tolerance, data.full.stats.rows
    split = "test" if data.test is not None else "validation"
    out = []
    for head in heads:
        where = head_prefix(data.full_prefix, head)
        ours = main_score(model, full, where, head)
        theirs = main_score(champion.model, champion.scores, where, head)
        if ours is None or theirs is None:
            text = f"no common metric on the whole {split} split to compare with {champion.label}"
            out.append((False, text))
            continue
        ok = ours.no_worse(theirs.value, tolerance)
        verb = "is no worse than" if ok else "is worse than"
        beyond = "within" if ok else "beyond"
        out.append(
            (
                ok,
                f"{ours.name}={ours.value:.4g} {verb} {champion.label}: {theirs.value:.4g} on the "
                f"whole {split} split ({rows} rows, older rows included), {beyond} "
                f"registry.forgetting_tolerance={tolerance:g}",
            )
        )
    return out


def _version_of(client, name: str, alias: str) -> str | None:
    try:
        return client.get_registered_model(name).aliases.get(alias)
    except Exception as exc:  # all but MLflow's RESOURCE_DOES_NOT_EXIST is raised as is
        if not tracking.is_mlflow_error(exc, "RESOURCE_DOES_NOT_EXIST"):
            raise
        return None


def _compile_like(champion, model) -> None:
    """Compile ``champion`` with ``model``'s loss and metrics, so both report the same names."""
    import keras

    config = model.get_compile_config() or {}
    keys = ("loss", "loss_weights", "metrics", "weighted_metrics")
    kept = {k: config[k] for k in keys if config.get(k) is not None}
    champion.compile(**keras.saving.deserialize_keras_object(kept))
