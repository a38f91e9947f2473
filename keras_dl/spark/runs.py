"""Where a ``KerasEstimator`` fit is tracked: its parent MLflow run and its run folder.

- **Parent run.** A fit inside an active MLflow run is its child. ``CrossValidator`` and
  ``TrainValidationSplit`` fit in pool threads, where MLflow (thread-local) sees no active
  run, so the estimator remembers the caller's run when it is copied (:func:`active_run_id`)
  and a fit uses it while it is still running (:func:`running`).
- **Run folder.** ``store/runs/<id>`` holds ``run.json``, ``config.yaml`` and the checkpoints
  (``runtime.run_dir``). A resumed fit finds its folder by the run id in ``run.json``. For an
  object-store ``store`` the folders are local for now, under
  ``<tempdir>/keras_dl_runs/<scheme>/<bucket>/<prefix>/runs``, since ``runtime.run_dir`` is a
  local path.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import uuid
from pathlib import Path

from keras_dl.errors import ConfigError

PARENT_TAG = "mlflow.parentRunId"


def active_run_id() -> str | None:
    """The MLflow run active in this thread, if any."""
    mlflow = sys.modules.get("mlflow")  # not imported yet: no run can be active
    run = mlflow.active_run() if mlflow is not None else None
    return run.info.run_id if run else None


def running(exp, run_id: str | None) -> str | None:
    """``run_id`` if that MLflow run is still running (a tuning parent), else None."""
    if not run_id:
        return None
    import mlflow

    try:
        status = mlflow.MlflowClient(exp.tracking.uri).get_run(run_id).info.status
    except Exception:
        return None
    return run_id if status == "RUNNING" else None


def in_parent_experiment(exp, parent: str):
    """``exp`` set to train in the parent run's MLflow experiment (the UI nests runs within one)."""
    import mlflow

    client = mlflow.MlflowClient(exp.tracking.uri)
    name = client.get_experiment(client.get_run(parent).info.experiment_id).name
    return dataclasses.replace(exp, tracking=dataclasses.replace(exp.tracking, experiment=name))


def tag_parent(exp, run_id: str, parent: str) -> None:
    """Make ``run_id`` a child of ``parent`` (a run started in a pool thread is top-level)."""
    import mlflow

    mlflow.MlflowClient(exp.tracking.uri).set_tag(run_id, PARENT_TAG, parent)


def place_run_dir(exp, store: str, run_id: str | None):
    """``exp`` with ``runtime.run_dir`` at a new ``store/runs/<id>``, or, with ``run_id``, at
    the folder of the run being resumed.

    Raises:
        ConfigError: No folder under the store's runs belongs to ``run_id``.
    """
    runs = runs_root(store)
    if run_id:
        for record in runs.glob("*/run.json"):
            if json.loads(record.read_text()).get("run_id") == run_id:
                return _with_run_dir(exp, record.parent)
        raise ConfigError(
            f"run_id={run_id!r}: no checkpoint folder under {runs} belongs to this run. "
            "Use the store of the fit that failed (on the machine that ran it, for an "
            "object-store store), or clear run_id to start afresh."
        )
    return _with_run_dir(exp, runs / uuid.uuid4().hex[:12])


def runs_root(store: str) -> Path:
    """``store/runs``; for an object-store ``store``, a local folder named after it."""
    if "://" not in store:
        return Path(store) / "runs"
    scheme, rest = store.split("://", 1)
    return Path(tempfile.gettempdir()) / "keras_dl_runs" / scheme / rest / "runs"


def recorded_run(exp) -> str | None:
    """The MLflow run id written in ``runtime.run_dir``/run.json, if any."""
    try:
        return json.loads((Path(exp.runtime.run_dir) / "run.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return None


def _with_run_dir(exp, path: Path):
    return dataclasses.replace(exp, runtime=dataclasses.replace(exp.runtime, run_dir=str(path)))
