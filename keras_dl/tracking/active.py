"""This process's active MLflow run (MLflow's fluent API): which run is active, the tracking URI
it logs to, and whether MLflow's own autolog is on.
"""

from __future__ import annotations

import sys
from typing import Any


def active_run_id(load: bool = True) -> str | None:
    """The id of the run active in this thread, or None.

    Args:
        load: Import MLflow to ask. Defaults to True; False: None while MLflow is not imported
            yet (no run can be active), without paying for the import.
    """
    if load:
        import mlflow
    else:
        mlflow = sys.modules.get("mlflow")
    run = mlflow.active_run() if mlflow is not None else None
    return run.info.run_id if run is not None else None


def tracking_uri() -> str:
    """The tracking URI MLflow logs to (``mlflow.set_tracking_uri``, else its default)."""
    import mlflow

    return mlflow.get_tracking_uri()


def set_tracking_uri(uri: str) -> None:
    """Point MLflow's fluent API (the active run) at ``uri``."""
    import mlflow

    mlflow.set_tracking_uri(uri)


def activate(run_id: str) -> Any:
    """Make ``run_id`` the active run (``mlflow.start_run(run_id=...)``): use it as a context
    manager, which ends the run when it exits."""
    import mlflow

    return mlflow.start_run(run_id=run_id)


def set_tags(tags: dict) -> None:
    """Tag the active run."""
    import mlflow

    mlflow.set_tags(tags)


def set_tag(key: str, value: Any) -> None:
    """Tag the active run."""
    import mlflow

    mlflow.set_tag(key, value)


def log_params(params: dict) -> None:
    """Log params to the active run."""
    import mlflow

    mlflow.log_params(params)


def log_metrics(metrics: dict, step: int | None = None) -> None:
    """Log metrics (at ``step``) to the active run."""
    import mlflow

    mlflow.log_metrics(metrics, step=step)


def autolog_on(flavor: str) -> bool:
    """True when MLflow's autolog of ``flavor`` ("tensorflow", "keras") is on; False with an
    MLflow that cannot say."""
    try:
        from mlflow.utils.autologging_utils import autologging_is_disabled
    except ImportError:  # an MLflow without it: log as usual
        return False
    return not autologging_is_disabled(flavor)
