"""Where a ``KerasEstimator`` fit is tracked: its parent MLflow run and its run folder.

- **Parent run.** A fit inside an active MLflow run is its child. ``CrossValidator`` and
  ``TrainValidationSplit`` fit in pool threads, where MLflow (thread-local) sees no active
  run, so the estimator remembers the caller's run when it is copied (:func:`active_run_id`)
  and a fit uses it while it is still running (:func:`running`).
- **Run folder.** ``store/runs/<id>`` holds ``run.json``, ``config.yaml`` and the checkpoints
  (``runtime.run_dir``), for a local ``store`` and an object-store one (``s3://bucket/prefix``)
  alike. A resumed fit, in this or another process or machine, finds its folder by the run id in
  ``run.json``, listed and read through :mod:`keras_dl.storage`.
"""

from __future__ import annotations

import dataclasses
import uuid

from keras_dl import storage, tracking
from keras_dl.errors import ConfigError
from keras_dl.run import RunFolder

PARENT_TAG = "mlflow.parentRunId"


def active_run_id() -> str | None:
    """The MLflow run active in this thread, if any."""
    return tracking.active_run_id(load=False)  # MLflow not imported yet: no run can be active


def running(exp, run_id: str | None) -> str | None:
    """``run_id`` if that MLflow run is still running (a tuning parent), else None."""
    if not run_id:
        return None
    try:
        status = tracking.client(exp.tracking.uri).get_run(run_id).info.status
    except Exception:
        return None
    return run_id if status == "RUNNING" else None


def in_parent_experiment(exp, parent: str):
    """``exp`` set to train in the parent run's MLflow experiment (the UI nests runs within one)."""
    client = tracking.client(exp.tracking.uri)
    name = client.get_experiment(client.get_run(parent).info.experiment_id).name
    return dataclasses.replace(exp, tracking=dataclasses.replace(exp.tracking, experiment=name))


def tag_parent(exp, run_id: str, parent: str) -> None:
    """Make ``run_id`` a child of ``parent`` (a run started in a pool thread is top-level)."""
    tracking.client(exp.tracking.uri).set_tag(run_id, PARENT_TAG, parent)


def place_run_dir(exp, store: str, run_id: str | None):
    """``exp`` with ``runtime.run_dir`` at a new ``store/runs/<id>``, or, with ``run_id``, at
    the folder of the run being resumed.

    Raises:
        ConfigError: No folder under the store's runs belongs to ``run_id``.
    """
    runs = runs_root(store)
    if run_id:
        for folder in run_folders(runs):
            if _recorded(folder) == run_id:
                return _with_run_dir(exp, folder)
        raise ConfigError(
            f"run_id={run_id!r}: no checkpoint folder under {runs} belongs to this run (none "
            "has it in its run.json). Use the store Param of the fit that failed, or clear "
            "run_id (setRunId(None)) to start afresh."
        )
    return _with_run_dir(exp, storage.join(runs, uuid.uuid4().hex[:12]))


def runs_root(store: str) -> str:
    """``store/runs``: a local path, or a URI for an object-store ``store``."""
    return storage.join(store, "runs")


def run_folders(runs: str) -> list[str]:
    """The run folders directly under ``runs`` (local path or URI), sorted; none if missing."""
    import pyarrow.fs as pafs

    where = storage.open_storage(runs)
    infos = where.fs.get_file_info(pafs.FileSelector(where.root, allow_not_found=True))
    names = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
    return [storage.join(runs, name) for name in names]


def recorded_run(exp) -> str | None:
    """The MLflow run id written in ``runtime.run_dir``/run.json, if any."""
    return _recorded(exp.runtime.run_dir)


def _recorded(folder: str) -> str | None:
    return RunFolder(folder).recorded_run_id()


def _with_run_dir(exp, path: str):
    return dataclasses.replace(exp, runtime=dataclasses.replace(exp.runtime, run_dir=str(path)))
