"""Logged and registered models: writing and logging a model folder with MLflow's flavors
(keras_dl.model.log puts its own loader around them), its signature, registering a version,
reading a logged model's MLmodel, loading it back."""

from __future__ import annotations

from typing import Any


def preload() -> None:
    """Import MLflow's model loading (``mlflow.pyfunc``) now: for a process that forks workers
    which load models (keras_dl.spark_daemon), so each starts with it in memory."""
    import mlflow.pyfunc  # noqa: F401


def load_keras_model(model_uri: str) -> Any:
    """The Keras model logged at ``model_uri`` (MLflow's Keras flavor)."""
    import mlflow.keras

    return mlflow.keras.load_model(model_uri)


def load_pyfunc_model(model_uri: str) -> Any:
    """The pyfunc model logged at ``model_uri`` (or in the model folder at that path)."""
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(model_uri)


def model_flavors(model_uri: str) -> dict:
    """The flavors of the model logged at ``model_uri`` (its MLmodel's, by name)."""
    import mlflow.models

    return mlflow.models.get_model_info(model_uri).flavors


def logged_model(path: str) -> Any:
    """MLflow's ``Model`` (the MLmodel file) of the model folder or MLmodel file at ``path``."""
    from mlflow.models import Model

    return Model.load(path)


def register_model(model_uri: str, name: str) -> str:
    """Register the model logged at ``model_uri`` as a new version of ``name``; its version."""
    import mlflow

    return mlflow.register_model(model_uri, name).version


def infer_signature(model_input: Any, model_output: Any) -> Any:
    """MLflow's signature inferred from ``model_input`` and ``model_output``."""
    from mlflow.models import infer_signature

    return infer_signature(model_input, model_output)


def download_artifacts(artifact_uri: str, dst_path: str) -> str:
    """Download ``artifact_uri`` (``models:/NAME/VERSION``, ``runs:/...``) under ``dst_path``;
    the local path."""
    import mlflow.artifacts

    return mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=dst_path)


def log_model(flavor: Any, **kwargs) -> Any:
    """Log a model to the active run as ``model``, its folder written by ``flavor`` (an object
    with a flavor module's ``save_model``, which gets ``kwargs``); MLflow's ``ModelInfo``."""
    from mlflow.models import Model

    return Model.log(artifact_path=None, name="model", flavor=flavor, **kwargs)


def save_pyfunc_model(path: str, **kwargs) -> None:
    """Write a pyfunc model folder at ``path`` (``mlflow.pyfunc.save_model``'s arguments)."""
    import mlflow.pyfunc

    mlflow.pyfunc.save_model(path, **kwargs)


def save_keras_model(model: Any, path: str, **kwargs) -> None:
    """Write a model folder with MLflow's Keras flavor at ``path``
    (``mlflow.keras.save_model``'s arguments)."""
    import mlflow.keras

    mlflow.keras.save_model(model, path, **kwargs)


def column_signature(model_input: Any, model_output: Any, optional=frozenset()) -> Any:
    """The column-based signature inferred from ``model_input`` (a DataFrame) and
    ``model_output``, the columns in ``optional`` declared ``required=False``."""
    from mlflow.models import ModelSignature
    from mlflow.models import infer_signature as infer
    from mlflow.types import ColSpec, Schema

    inferred = infer(model_input, model_output)
    inputs = Schema(
        [ColSpec(c.type, c.name, required=c.name not in optional) for c in inferred.inputs.inputs]
    )
    return ModelSignature(inputs=inputs, outputs=inferred.outputs)
