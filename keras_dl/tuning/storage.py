"""The study's Optuna storage: a journal file beside the MLflow store, resumable after a kill.

A journal file (Optuna's ``JournalFileBackend``) takes appends from several processes on one
host under a file lock: the driver and the Spark tasks of a local or loopback standalone
cluster. Every finished trial is in it, so a rerun of the same command counts them against
``tune.trials`` and does not run them again. Trials left RUNNING by a killed driver are marked
FAIL and their values queued again (:func:`requeue_stale`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from keras_dl.config.schema import Experiment
from keras_dl.errors import ConfigError

log = logging.getLogger(__name__)

FINISHED = ("COMPLETE", "PRUNED")
TASK_ATTR = "spark_task"  # which Spark task of which fan-out ran the trial (its retries too)


def storage_path(exp: Experiment, study: str) -> str:
    """``tune.storage``, else ``optuna-<study>.journal`` beside a SQLite MLflow store, else in
    ``runtime.run_dir``."""
    if exp.tune.storage:
        return exp.tune.storage
    uri = exp.tracking.uri
    if uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///") :]).parent
    else:
        folder = Path(exp.runtime.run_dir)
    if "://" in str(folder):
        raise ConfigError(
            f"The study's journal cannot live beside {uri} or in {exp.runtime.run_dir}: it "
            "needs a local (or shared) file. Set --set tune.storage=PATH/optuna.journal."
        )
    return str(folder / f"optuna-{study}.journal")


def open_study(path: str, study: str, direction: str, seed: int, pruning: bool):
    """Create the study in the journal at ``path``, or load it when it exists (a resume).

    Raises:
        ConfigError: The existing study optimizes in the other direction.
    """
    import optuna

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    made = optuna.create_study(
        storage=_storage(path),
        study_name=study,
        direction=direction,
        sampler=_sampler(seed),
        pruner=_pruner(pruning),
        load_if_exists=True,
    )
    if made.direction.name.lower() != direction:
        raise ConfigError(
            f"Study {study!r} in {path} was made to {made.direction.name.lower()}, not "
            f"{direction}. Name another study (--set tune.study=NAME) or keep tune.direction."
        )
    return made


def load_study(path: str, study: str, seed: int, pruning: bool = True):
    """The study as a Spark task (or the driver) opens it to run trials (the sampler and the
    pruner belong to the process, not to the storage)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(
        study_name=study, storage=_storage(path), sampler=_sampler(seed), pruner=_pruner(pruning)
    )


def held_trials(study, task: str) -> tuple[list, list]:
    """The trials the Spark task ``task`` (:data:`TASK_ATTR`) ran in its earlier attempts:
    ``(ended, running)``. Ended ones (complete, pruned or failed) count against the task's
    share; running ones are its dead attempt's, for :func:`requeue_stale`."""
    held = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(TASK_ATTR) == task]
    ended = [t for t in held if t.state.is_finished()]
    return ended, [t for t in held if t.state.name == "RUNNING"]


def finished_trials(study) -> list:
    """The trials that count against the budget: COMPLETE and PRUNED."""
    return [t for t in study.get_trials(deepcopy=False) if t.state.name in FINISHED]


def requeue_stale(study, held_by: str | None = None) -> list:
    """Mark trials left RUNNING (their driver was killed) FAIL, and queue their values again.

    Only one driver runs a study at a time (the caller holds the run folder's lock), so a
    RUNNING trial at the start is one whose process is gone. A trial the kill caught between
    ``study.ask()`` and choosing its values has none to run again: it is marked FAIL and not
    queued (the budget counts finished trials, so a fresh trial takes its place); one caught
    part-way through choosing them queues the values it had. With ``held_by``, only the
    trials that Spark task held (:data:`TASK_ATTR`): a retried task's dead attempt's, while
    the other tasks' trials run on. Returns the stale trials.
    """
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    if held_by is not None:
        stale = [t for t in stale if t.user_attrs.get(TASK_ATTR) == held_by]
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if t.params:
            study.enqueue_trial(t.params, skip_if_exists=False)
    if stale:
        log.warning(
            "Trial(s) %s were running when %s; their values run again.",
            ", ".join(str(t.number) for t in stale),
            "the last tune stopped" if held_by is None else f"Spark task {held_by} failed",
        )
    return stale


def _storage(path: str):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(path))


def _sampler(seed: int):
    import optuna

    # constant_liar: trials running in parallel count as if they had scored badly, so two
    # workers asking at once do not both try the same region.
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, constant_liar=True)


def _pruner(pruning: bool):
    import optuna

    if not pruning:
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
