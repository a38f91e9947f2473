"""The MLflow run: one training's run in the tracking store, created or attached, with its
config, tags and end status. (The one module that does this; keras_dl's own run, with its folder
and lock, is :class:`keras_dl.run.Run`, which calls these.)

A training's run is created once (by ``fit`` on the chief, or by the Horovod launcher's driver,
which passes its id to the ranks) and ended once; the tuning and scaling studies create and end
theirs with the same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from keras_dl.config import Experiment, to_dict, to_flat_dict
from keras_dl.tracking.client import client as _client
from keras_dl.tracking.store import (
    FAILURE_REASON_TAG,
    FAILURE_TAG,
    PREEMPTED_TAG,
    failure_tags,
    git_tags,
    setup_mlflow,
)

log = logging.getLogger(__name__)


def run_tags(exp: Experiment, tags: Mapping[str, str]) -> dict[str, str]:
    """The tags every keras_dl run carries: its recipe, ``tags``, and the code's git commit."""
    return {"keras_dl.recipe": exp.recipe, **dict(tags), **git_tags()}


def start_run(exp: Experiment, tags: Mapping[str, str], run_id: str | None = None) -> str:
    """Start (or, with ``run_id``, resume) the run of ``exp``; a new run gets its config as
    params and as the ``config.yaml`` artifact.

    Returns:
        The run id.
    """
    import mlflow

    experiment_id = setup_mlflow(
        exp.tracking.uri, exp.tracking.experiment, exp.tracking.artifact_location
    )
    # Nested under a run already active in this thread (e.g. a tuning run around
    # CrossValidator over keras_dl.spark.KerasEstimator), rather than an error.
    nested = mlflow.active_run() is not None
    run = mlflow.start_run(run_id=run_id, experiment_id=experiment_id, nested=nested)
    if run_id is None:
        _log_config(_client(exp.tracking.uri), run.info.run_id, exp)
    mlflow.set_tags(run_tags(exp, tags))
    return run.info.run_id


def create_run(exp: Experiment, tags: Mapping[str, str]) -> str:
    """Create, without activating it in this process, the run of ``exp`` with its config (as
    params and the ``config.yaml`` artifact) and ``tags``: how a launcher makes the run its
    ranks attach to. Returns the run id."""
    experiment_id = setup_mlflow(
        exp.tracking.uri, exp.tracking.experiment, exp.tracking.artifact_location
    )
    client = _client(exp.tracking.uri)
    run = client.create_run(experiment_id, tags=run_tags(exp, tags))
    _log_config(client, run.info.run_id, exp)
    return run.info.run_id


def _log_config(client: Any, run_id: str, exp: Experiment) -> None:
    from mlflow.entities import Param

    params = [Param(k, param_text(v)) for k, v in to_flat_dict(exp).items()]
    for i in range(0, len(params), 100):  # MLflow's limit per batch
        client.log_batch(run_id, params=params[i : i + 100])
    client.log_dict(run_id, to_dict(exp), "config.yaml")  # the resolved config, for lineage


# What an earlier attempt of a resumed run said about why it stopped (failed, diverged,
# preempted): a FINISHED end makes these false, so it deletes them. The launcher's
# keras_dl.restart.N tags stay: they record restarts that happened, not the run's state.
STALE_ON_FINISH = (FAILURE_TAG, FAILURE_REASON_TAG, PREEMPTED_TAG)


def terminate_run(uri: str, run_id: str, status: str, tags: Mapping[str, str] = ()) -> None:
    """End run ``run_id`` (not active in this process) with ``status`` and ``tags``; a
    FINISHED end deletes the failure tags an earlier attempt left (:data:`STALE_ON_FINISH`)."""
    client = _client(uri)
    for key, value in dict(tags).items():
        client.set_tag(run_id, key, value)
    if status == "FINISHED":
        _clear_stale_tags(client, run_id)
    client.set_terminated(run_id, status)


def end_run(
    status: str = "FINISHED",
    reason: BaseException | str | None = None,
    tags: Mapping[str, str] | None = None,
) -> None:
    """End the active run with ``status`` ("FINISHED", "FAILED" or "KILLED"), if there is one.

    A FINISHED end deletes the failure tags an earlier attempt of a resumed run left
    (:data:`STALE_ON_FINISH`): the run's tags describe how it ended, not its history.

    Args:
        status: The run's final status. Defaults to "FINISHED".
        reason: Why it did not finish, set as the ``keras_dl.failure`` tag (an exception is
            written as ``Type: message``). Defaults to None (no tag).
        tags: More tags, e.g. ``{"preempted": "SIGTERM"}``. Defaults to None.
    """
    import mlflow

    if mlflow.active_run() is None:
        return
    if reason is not None or tags:
        try:
            extra = failure_tags(reason) if reason is not None else {}
            mlflow.set_tags({**(tags or {}), **extra})
        except Exception as exc:  # the status below matters more than the tag
            log.warning("Could not tag the run with its failure (%s).", exc)
    if status == "FINISHED":
        _clear_stale_tags(_client(), mlflow.active_run().info.run_id)
    mlflow.end_run(status=status)


def _clear_stale_tags(client: Any, run_id: str) -> None:
    """Delete :data:`STALE_ON_FINISH` tags from ``run_id`` (a warning, not an error, if that
    fails: the FINISHED status matters more)."""
    try:
        present = client.get_run(run_id).data.tags
        for key in STALE_ON_FINISH:
            if key in present:
                client.delete_tag(run_id, key)
    except Exception as exc:
        log.warning("Could not delete the stale failure tags of run %s (%s).", run_id, exc)


def param_text(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return "" if value is None else str(value)
