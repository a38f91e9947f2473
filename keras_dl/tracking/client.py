"""The MLflow client: :func:`client` is how keras_dl gets an ``MlflowClient``.

MLflow is imported when a client is made, not when keras_dl is: a command that never tracks
never pays for the import.
"""

from __future__ import annotations

from typing import Any


def client(uri: str | None = None) -> Any:
    """An ``MlflowClient`` for the tracking store at ``uri``.

    Args:
        uri: The tracking URI. Defaults to None: MLflow's current one (``mlflow.set_tracking_uri``
            or ``MLFLOW_TRACKING_URI``).
    """
    import mlflow

    return mlflow.MlflowClient(uri)


def metric(key: str, value: float, timestamp_ms: int, step: int | None) -> Any:
    """An MLflow ``Metric`` entity, for a client's ``log_batch`` (or :func:`~keras_dl.tracking.rest.send_batch`)."""
    from mlflow.entities import Metric

    return Metric(key, value, timestamp_ms, step)


def param(key: str, value: Any) -> Any:
    """An MLflow ``Param`` entity, for a client's ``log_batch`` (or :func:`~keras_dl.tracking.rest.send_batch`)."""
    from mlflow.entities import Param

    return Param(key, value)


def is_mlflow_error(exc: BaseException, error_code: str | None = None) -> bool:
    """True when ``exc`` is an ``MlflowException`` (with ``error_code``, when given, e.g.
    ``RESOURCE_DOES_NOT_EXIST``)."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and error_code in (None, exc.error_code)


def artifact_repository(root: str) -> Any:
    """MLflow's artifact repository at ``root`` (a run's ``artifact_uri``): reads it straight,
    where a ``runs:/`` URI would also look for logged models."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    return get_artifact_repository(root)
