"""Trials: each one ``fit`` of the experiment with the trial's values, in a nested MLflow run.

:func:`run_trials` is what runs in the driver (``tune.parallelism=1``) or in each Spark task:
it asks the shared Optuna storage for a trial, trains it, and tells the storage the outcome,
``count`` times. Every trial gets:

- its own MLflow run, a child of the study's parent run (``mlflow.parentRunId``), with the
  trial's config as params, its per-epoch metrics and the tag ``keras_dl.tune.state``
  (complete, pruned or failed);
- its own run folder, ``<runtime.run_dir>/tune/<study>/trial-<N>``;
- no registration: only the study's best model goes through the registry gate
  (:mod:`keras_dl.tuning.best`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass

from keras_dl.config.schema import Experiment
from keras_dl.distribute.gpus import VISIBLE, assigned_by_spark
from keras_dl.errors import KerasDLError
from keras_dl.tuning.space import Dimension, apply_values
from keras_dl.tuning.storage import TASK_ATTR

log = logging.getLogger(__name__)

TRIAL_TAG = "keras_dl.tune.trial"
STATE_TAG = "keras_dl.tune.state"
GPUS_TAG = "keras_dl.tune.task_gpus"  # the GPUs Spark gave the task that ran the trial
RUN_ATTR = "mlflow_run_id"
MODEL_ATTR = "model_uri"
PROCESS_ATTR = "process"  # host:pid of the driver or Spark task that ran the trial


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial needs, picklable for a Spark task."""

    exp: Experiment
    space: tuple[Dimension, ...]
    study: str
    storage: str
    metric: str
    direction: str
    parent_run_id: str


def run_trials(spec: TrialSpec, count: int, worker: int = 0, task: str | None = None) -> list[int]:
    """Ask for, train and tell ``count`` trials; return their numbers.

    Trials the driver re-queued after a kill (WAITING) are asked for first. ``task`` names the
    Spark task running them, the same in each attempt Spark makes of it: a retried task counts
    the trials its earlier attempts ended against ``count``, and the one its dead attempt left
    RUNNING is marked FAIL, its values queued again and its MLflow run ended KILLED. Without
    that, a retry would run its whole share again and leave the study a trial over budget.
    """
    from keras_dl.tuning.storage import held_trials, load_study, requeue_stale

    study = load_study(spec.storage, spec.study, spec.exp.tune.seed + worker, spec.exp.tune.pruning)
    ended: list = []
    if task is not None:
        ended, running = held_trials(study, task)
        if running:
            end_stale_runs(spec.exp, spec.parent_run_id, requeue_stale(study, held_by=task))
    numbers = [t.number for t in ended]
    return numbers + [run_trial(spec, study, task) for _ in range(count - len(ended))]


def run_trial(spec: TrialSpec, study, task: str | None = None) -> int:
    """Train one trial of ``study``; return its number. A trial whose training raised a
    :class:`~keras_dl.errors.KerasDLError` (e.g. it diverged) is FAIL; anything else is raised
    after the trial is marked FAIL."""
    import keras
    from optuna.trial import TrialState

    from keras_dl import tracking
    from keras_dl.tracking import create_run
    from keras_dl.tuning.pruning import OptunaPruning

    trial = study.ask()
    # Who runs it, first: a trial a kill leaves RUNNING still says which process held it.
    trial.set_user_attr(PROCESS_ATTR, f"{socket.gethostname()}:{os.getpid()}")
    if task is not None:
        trial.set_user_attr(TASK_ATTR, task)
    values = {d.key: d.suggest(trial) for d in spec.space}
    exp = _trial_experiment(spec, trial.number, values)
    tags = {
        "mlflow.parentRunId": spec.parent_run_id,
        "mlflow.runName": f"trial-{trial.number}",
        TRIAL_TAG: str(trial.number),
        "keras_dl.tune.study": spec.study,
    }
    if assigned_by_spark():  # a trial in a Spark task trains on the task's GPUs (fanout)
        tags[GPUS_TAG] = os.environ[VISIBLE]
    child = create_run(exp, tags)
    trial.set_user_attr(RUN_ATTR, child)
    client = tracking.client(exp.tracking.uri)
    pruning = OptunaPruning(trial, spec.metric, prune=exp.tune.pruning)
    keras.backend.clear_session()  # trials share this process: one graph each
    try:
        model_uri = _train(exp, child, pruning)
    except BaseException as exc:
        study.tell(trial, state=TrialState.FAIL)
        client.set_tag(child, STATE_TAG, "failed")
        if not isinstance(exc, KerasDLError):
            raise
        log.warning("Trial %d failed: %s", trial.number, exc)
        return trial.number
    if model_uri:
        trial.set_user_attr(MODEL_ATTR, model_uri)
    if pruning.pruned_epoch is not None:
        study.tell(trial, state=TrialState.PRUNED)
        state = "pruned"
    else:
        study.tell(trial, pruning.last_value)
        state = "complete"
    client.set_tag(child, STATE_TAG, state)
    return trial.number


def end_stale_runs(exp: Experiment, parent: str, stale: list) -> None:
    """The MLflow runs of trials a killed driver or task attempt left running end KILLED
    (their values re-queued).

    A trial records its run's id once the run exists: a kill in between leaves a RUNNING run
    the trial does not name, found by its parent and its trial tag instead.
    """
    from keras_dl import tracking
    from keras_dl.tracking import terminate_run

    if not stale:
        return
    runs = {t.user_attrs[RUN_ATTR] for t in stale if t.user_attrs.get(RUN_ATTR)}
    numbers = {str(t.number) for t in stale}
    client = tracking.client(exp.tracking.uri)
    experiment = client.get_run(parent).info.experiment_id
    children = client.search_runs(
        [experiment],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and attributes.status = 'RUNNING'",
        max_results=1000,
    )
    runs |= {r.info.run_id for r in children if r.data.tags.get(TRIAL_TAG) in numbers}
    for run_id in sorted(runs):
        terminate_run(exp.tracking.uri, run_id, "KILLED", {STATE_TAG: "killed"})


def _train(exp: Experiment, run_id: str, pruning) -> str | None:
    """``fit`` in this process, or on Horovod ranks or multi-worker workers (``runtime.np``):
    a multi-process trial is scored on its last epoch, and is not pruned (rank 0's callback
    runs in another process). Returns the logged model's URI."""
    if exp.runtime.launches:
        from keras_dl.launch import launch

        result = launch(exp, run_id=run_id)
        history = result.history.get(pruning.monitor) or [None]
        pruning.last_value = history[-1]
        return result.model_uri
    from keras_dl.train import fit

    return fit(exp, callbacks=[pruning], run_id=run_id).model_uri


def _trial_experiment(spec: TrialSpec, number: int, values: dict[str, str]) -> Experiment:
    """The study's experiment with the trial's values, its own run folder, no registration."""
    exp = apply_values(spec.exp, values, origin=f"trial {number} of study {spec.study!r}")
    base = exp.runtime.run_dir.rstrip("/")
    runtime = dataclasses.replace(
        exp.runtime, run_dir=f"{base}/tune/{spec.study}/trial-{number}", resume=False
    )
    tracking = dataclasses.replace(exp.tracking, registered_model="none")
    return dataclasses.replace(exp, runtime=runtime, tracking=tracking)
