"""After the trials: the study as artifacts of the parent run, and the best model's registration.

The parent run gets ``study/trials.csv`` and ``study/trials.html`` (one row per trial: number,
state, value, params, child run), ``study/history.png`` (each trial's value and the best so
far), the metric ``best_value`` and the tags ``keras_dl.tune.best_trial`` and
``keras_dl.tune.best_run_id``. The best complete trial's logged model then goes through the
registry gate (:func:`keras_dl.run.finish.register_earned`) on its own child run, exactly as a
``train`` run's model would: it is registered only when it earns it.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keras_dl.tuning.trial import MODEL_ATTR, RUN_ATTR, TrialSpec

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """What a study produced: its parent run, the best trial and what the gate decided."""

    study: str
    storage: str
    parent_run_id: str
    best_trial: int | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    best_run_id: str | None = None
    registered_version: int | None = None
    not_registered: str | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)


def finish_study(spec: TrialSpec, study):
    """Log the study to the parent run, register the best model if it earns it, and return
    the :class:`~keras_dl.tuning.study.TuneResult`."""
    from keras_dl import tracking

    client = tracking.client(spec.exp.tracking.uri)
    rows = trial_rows(study)
    result = TuneResult(spec.study, spec.storage, spec.parent_run_id, trials=rows)
    _log_tables(client, spec, rows)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        log.warning("No trial of study %r completed: nothing to register.", spec.study)
        return result
    best = study.best_trial
    result.best_trial, result.best_value = best.number, best.value
    result.best_params = dict(best.params)
    result.best_run_id = best.user_attrs.get(RUN_ATTR)
    client.log_metric(spec.parent_run_id, "best_value", best.value)
    client.set_tag(spec.parent_run_id, "keras_dl.tune.best_trial", str(best.number))
    client.set_tag(spec.parent_run_id, "keras_dl.tune.best_run_id", str(result.best_run_id))
    for key, value in best.params.items():
        client.set_tag(spec.parent_run_id, f"keras_dl.tune.best.{key}", str(value))
    name = spec.exp.tracking.registered_model
    model_uri = best.user_attrs.get(MODEL_ATTR)
    tags = client.get_run(spec.parent_run_id).data.tags
    if tags.get("keras_dl.tune.registered_run") == result.best_run_id:  # a rerun: done already
        result.registered_version = int(tags["keras_dl.tune.registered"].rsplit("/", 1)[1])
    elif name and name != "none" and model_uri and result.best_run_id:
        version, refused = _register_best(spec, best, result.best_run_id, model_uri)
        result.registered_version, result.not_registered = version, refused
        if version is not None:
            client.set_tag(spec.parent_run_id, "keras_dl.tune.registered", f"{name}/{version}")
            client.set_tag(spec.parent_run_id, "keras_dl.tune.registered_run", result.best_run_id)
    return result


def trial_rows(study) -> list[dict]:
    """One dict per trial: number, state, value, its params, its MLflow run."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append(
            {
                "number": t.number,
                "state": t.state.name.lower(),
                "value": t.value,
                "epochs": len(t.intermediate_values),
                **{f"param.{k}": v for k, v in sorted(t.params.items())},
                "run_id": t.user_attrs.get(RUN_ATTR, ""),
            }
        )
    return rows


def _log_tables(client, spec: TrialSpec, rows: list[dict]) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    with tempfile.TemporaryDirectory(prefix="keras_dl_study_") as tmp:
        folder = Path(tmp, "study")
        folder.mkdir()
        frame.to_csv(folder / "trials.csv", index=False)
        title = f"<h1>Study {spec.study}: {spec.direction} {spec.metric}</h1>\n"
        (folder / "trials.html").write_text(title + frame.to_html(index=False, na_rep=""))
        _plot(frame, spec, folder / "history.png")
        client.log_artifacts(spec.parent_run_id, str(folder), "study")


def _plot(frame, spec: TrialSpec, path: Path) -> None:
    """Each trial's value by number (pruned trials at their last report), best so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    done = frame[frame["state"] == "complete"].sort_values("number")
    if len(done):
        ax.scatter(done["number"], done["value"], label="complete")
        best = done["value"].cummin() if spec.direction == "minimize" else done["value"].cummax()
        ax.step(done["number"], best, where="post", label="best so far")
    pruned = frame[(frame["state"] == "pruned") & frame["value"].notna()]
    if len(pruned):
        ax.scatter(pruned["number"], pruned["value"], marker="x", label="pruned (last epoch)")
    ax.set_xlabel("trial")
    ax.set_ylabel(spec.metric)
    ax.set_title(f"study {spec.study}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _register_best(spec: TrialSpec, best, run_id: str, model_uri: str):
    """The registry gate on the best trial's model, its data and its test metrics, with the
    decision tagged on the trial's run (as ``train`` tags its own)."""
    from keras_dl import tracking
    from keras_dl.data.splits import make_splits
    from keras_dl.recipe import configure, load_recipe
    from keras_dl.run.finish import register_earned
    from keras_dl.tuning.space import apply_values

    values = {k: _text(v) for k, v in best.params.items()}
    exp = apply_values(spec.exp, values, origin=f"best trial {best.number}")
    recipe = load_recipe(exp.recipe)
    exp = configure(exp, recipe)
    if recipe.prepare is not None:
        recipe = recipe.prepare(exp)
    data = make_splits(
        exp.data,
        exp.train.batch_size,
        accept=recipe.accept,
        preprocess=recipe.preprocess,
        class_weight=exp.train.class_weight,
    )
    client = tracking.client(exp.tracking.uri)
    metrics = {
        k: v for k, v in client.get_run(run_id).data.metrics.items() if k.startswith("test_")
    }
    model = tracking.load_keras_model(model_uri)
    with data.original_errors():
        tracking.set_tracking_uri(exp.tracking.uri)
        with tracking.activate(run_id):
            return register_earned(exp, model, data, metrics, run_id, model_uri)


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)
