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
