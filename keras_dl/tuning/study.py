"""``tune(exp, space)``: an Optuna study over a recipe, one parent MLflow run, a child per trial.

The driver owns the study: it opens (or resumes) the study's journal beside the MLflow store,
re-queues the trials a killed driver left running, creates the parent run (or continues the
one the study records), runs what is left of ``tune.trials`` (in this process, or
``tune.parallelism`` Spark tasks at a time), then logs the study and sends the best trial's
model through the registry gate (:mod:`keras_dl.tuning.best`). The parent run ends FINISHED,
or FAILED / KILLED when the search stops; rerunning the same command resumes it.
"""

from __future__ import annotations

import logging

from keras_dl.config.schema import Experiment
from keras_dl.errors import ConfigError
from keras_dl.extras import import_extra
from keras_dl.runlock import open_run_lock
from keras_dl.tuning.best import TuneResult, finish_study
from keras_dl.tuning.space import Dimension, check_space
from keras_dl.tuning.storage import finished_trials, open_study, requeue_stale, storage_path
from keras_dl.tuning.trial import TrialSpec, end_stale_runs, run_trials

log = logging.getLogger(__name__)

PARENT_ATTR = "mlflow_parent_run_id"


def tune(exp: Experiment, space: list[Dimension]) -> TuneResult:
    """Search ``space`` over ``exp``'s recipe for ``tune.trials`` trials.

    Args:
        exp: A resolved experiment (see :func:`keras_dl.config.resolve`); its ``tune``
            section sets the budget, the parallelism, the metric and the study.
        space: The dimensions, from :func:`~keras_dl.tuning.space.parse_space` or
            :func:`~keras_dl.tuning.space.read_space`.

    Returns:
        The study's :class:`TuneResult`.

    Raises:
        RunLockedError: Another ``tune`` of the same study runs (it holds
            ``<runtime.run_dir>/tune/<study>``).
        ConfigError: An unknown key or a value a field does not take in ``space``; a metric
            that is not a validation metric with no validation split.
        MissingExtra: Optuna is not installed ([tune]), or PySpark for more than one trial at
            a time ([spark]).
    """
    from keras_dl.tuning.pruning import direction_of

    import_extra("optuna", "keras-dl tune")
    if min(exp.tune.parallelism, exp.tune.trials) > 1:
        import_extra("pyspark", f"tune.parallelism={exp.tune.parallelism} (trials as Spark tasks)")
    check_space(exp, list(space))
    metric = exp.tune.metric or exp.callbacks.monitor
    if metric.startswith("val_") and not (exp.data.validation_table or exp.data.validation_split):
        raise ConfigError(
            f"tune.metric={metric!r} is a validation metric, but the experiment has no "
            "validation split. Set data.validation_split or data.validation_table."
        )
    direction = direction_of(metric, exp.tune.direction)
    name = exp.tune.study or exp.recipe
    path = storage_path(exp, name)
    # One driver per study: a second one would take the first one's running trials for a
    # killed driver's. The flock is the kernel's: a killed driver's is free at once.
    lock = open_run_lock(
        f"{exp.runtime.run_dir.rstrip('/')}/tune/{name}", exp.runtime.lease_seconds
    )
    lock.acquire()
    try:
        study = open_study(path, name, direction, exp.tune.seed, exp.tune.pruning)
        stale = requeue_stale(study)
        parent = _parent_run(exp, study, space, path)
        lock.update(run_id=parent)
        end_stale_runs(exp, parent, stale)
        spec = TrialSpec(exp, tuple(space), name, path, metric, direction, parent)
        try:
            left = exp.tune.trials - len(finished_trials(study))
            if left > 0:
                _run(spec, left, exp.tune.parallelism)
            result = finish_study(spec, study)
        except BaseException as exc:
            _end_parent(exp, parent, exc)
            raise
        _end_parent(exp, parent, None)
        return result
    finally:
        lock.release()


def _run(spec: TrialSpec, left: int, parallelism: int) -> None:
    """``left`` trials: here, or split over ``parallelism`` Spark tasks (each runs its share
    one after another, so at most ``parallelism`` train at a time)."""
    workers = min(parallelism, left)
    if workers == 1:
        run_trials(spec, left)
        return
    quotas = [left // workers + (1 if i < left % workers else 0) for i in range(workers)]
    from keras_dl.tuning.fanout import run_on_spark

    run_on_spark(spec, quotas)


def _parent_run(exp: Experiment, study, space, path: str) -> str:
    """The study's parent run: the one it records (a resume), else a new one."""
    from keras_dl import tracking
    from keras_dl.tracking import create_run, setup_mlflow

    setup_mlflow(exp.tracking.uri, exp.tracking.experiment, exp.tracking.artifact_location)
    client = tracking.client(exp.tracking.uri)
    parent = study.user_attrs.get(PARENT_ATTR)
    if parent is not None:
        client.update_run(parent, status="RUNNING")
        client.set_tag(parent, "keras_dl.tune.resumed", "true")
        return parent
    parent = create_run(
        exp, {"mlflow.runName": f"tune-{study.study_name}", "keras_dl.tune.study": study.study_name}
    )
    client.set_tag(parent, "keras_dl.tune.space", "; ".join(str(d) for d in space)[:5000])
    client.set_tag(parent, "keras_dl.tune.storage", path)
    study.set_user_attr(PARENT_ATTR, parent)
    return parent


def _end_parent(exp: Experiment, parent: str, error: BaseException | None) -> None:
    from keras_dl.tracking import terminate_run

    if error is None:
        terminate_run(exp.tracking.uri, parent, "FINISHED")
    elif isinstance(error, (KeyboardInterrupt, SystemExit)):
        terminate_run(exp.tracking.uri, parent, "KILLED", {"keras_dl.tune.stopped": "interrupted"})
    else:
        terminate_run(
            exp.tracking.uri, parent, "FAILED", {"keras_dl.tune.error": str(error)[:5000]}
        )
