"""Logged models, loaded back from MLflow."""

from __future__ import annotations

from typing import Any


def load_keras_model(model_uri: str) -> Any:
    """The Keras model logged at ``model_uri`` (MLflow's Keras flavor)."""
    import mlflow.keras

    return mlflow.keras.load_model(model_uri)
