"""MLflow: one run per training, holding the config, lineage, metrics, model and registry version.

Only the chief calls these. The default store is a SQLite file in the working directory, with
artifacts in ``mlartifacts/`` next to it, so a run is self-contained on a laptop or in a test.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keras_dl.config import Experiment, to_dict, to_flat_dict

log = logging.getLogger(__name__)


def setup_mlflow(uri: str, experiment: str) -> str:
    """Point MLflow at ``uri`` and make sure ``experiment`` exists; return its id.

    For a SQLite URI, new experiments keep artifacts in ``mlartifacts/`` beside the database.
    """
    import mlflow

    mlflow.set_tracking_uri(uri)
    existing = mlflow.get_experiment_by_name(experiment)
    if existing is not None:
        return existing.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        artifact_location = (db.parent / "mlartifacts").absolute().as_uri()
    try:
        return mlflow.create_experiment(experiment, artifact_location=artifact_location)
    except Exception:  # created concurrently by another process
        return mlflow.get_experiment_by_name(experiment).experiment_id


def start_run(exp: Experiment, tags: Mapping[str, str], run_id: str | None = None) -> str:
    """Start (or, with ``run_id``, resume) the run of ``exp``; log its config as params.

    Returns:
        The run id.
    """
    import mlflow

    experiment_id = setup_mlflow(exp.tracking.uri, exp.tracking.experiment)
    run = mlflow.start_run(run_id=run_id, experiment_id=experiment_id)
    if run_id is None:
        mlflow.log_params({k: _param(v) for k, v in to_flat_dict(exp).items()})
        mlflow.log_dict(to_dict(exp), "config.yaml")  # the resolved config, for lineage
    mlflow.set_tags({"keras_dl.recipe": exp.recipe, **tags, **git_tags()})
    return run.info.run_id


def end_run(status: str = "FINISHED") -> None:
    """End the active run with ``status`` ("FINISHED", "FAILED" or "KILLED"), if there is one."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.end_run(status=status)


def log_keras_model(
    model: Any,
    sample_input: Any,
    registered_model: str | None,
    tags: Mapping[str, str] = (),
    description: str | None = None,
) -> tuple[str, int | None]:
    """Log ``model`` to the active run with a signature inferred from ``sample_input``.

    A model whose inputs are named scalar columns (a dict of 1-D arrays) is logged as a
    :class:`keras_dl.frame_model.KerasFrameModel` pyfunc with a column-based signature, because
    MLflow's Keras flavor cannot feed string columns to Keras 3; any other model with the Keras
    flavor and a tensor signature.

    Args:
        model: A Keras 3 model.
        sample_input: A small batch of model input (numpy array or dict of arrays).
        registered_model: Registry name, or None/"none" to skip registration.
        tags: Tags set on the registered version (lineage); the git commit is added.
            Defaults to none.
        description: Description of the registered version. Defaults to None.

    Returns:
        The model URI and the registered version (None when not registered).
    """
    import mlflow

    from keras_dl.frame_model import is_frame_input, log_frame_model, model_requirements

    register = registered_model if registered_model and registered_model != "none" else None
    if is_frame_input(sample_input):
        info = log_frame_model(model, sample_input, register)
    else:
        prediction = model.predict(sample_input, verbose=0)
        signature = make_signature(sample_input, prediction)
        info = mlflow.keras.log_model(
            model,
            name="model",
            signature=signature,
            registered_model_name=register,
            pip_requirements=model_requirements(),
        )
    version = getattr(info, "registered_model_version", None)
    if register and version is not None:
        client = mlflow.MlflowClient()
        for key, value in {**dict(tags), **git_tags()}.items():
            client.set_model_version_tag(register, str(version), key, str(value))
        if description:
            client.update_model_version(register, str(version), description=description)
    return info.model_uri, None if version is None else int(version)


def describe_version(exp: Experiment, lineage: Mapping[str, str], metrics: Mapping) -> str:
    """A registered version's description: what it was trained on, its metrics, its config."""
    import yaml

    scores = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())) or "none"
    return (
        f"Recipe {exp.recipe} trained on {lineage.get('data.table')} "
        f"(version {lineage.get('data.version') or 'n/a'}), git commit "
        f"{git_tags().get('mlflow.source.git.commit', 'unknown')}. Test metrics: {scores}.\n\n"
        f"Resolved config (also config.yaml in the run's artifacts):\n\n"
        + yaml.safe_dump(to_dict(exp), sort_keys=False)
    )


def make_signature(sample_input: Any, prediction: Any):
    """The model signature for ``sample_input``: MLflow's inferred tensor signature, except that
    floating-point inputs are declared float64.

    MLflow's Keras flavor requires tensor signatures, and tensor inputs must match the declared
    dtype exactly. pandas holds floats as float64, so declaring float64 lets a DataFrame of raw
    values score as is; the model casts to its own input dtype.
    """
    import numpy as np
    from mlflow.models import infer_signature

    def widen(x):
        x = np.asarray(x)
        return x.astype(np.float64) if x.dtype.kind == "f" else x

    if isinstance(sample_input, dict):
        sample = {k: widen(v) for k, v in sample_input.items()}
    else:
        sample = widen(sample_input)
    return infer_signature(
        sample, np.asarray(prediction) if not isinstance(prediction, dict) else prediction
    )


def git_tags() -> dict[str, str]:
    """``mlflow.source.git.commit`` for the code's git checkout, when there is one."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"mlflow.source.git.commit": commit} if commit else {}


def ui_command(uri: str) -> str:
    """The shell command that opens the MLflow UI on ``uri``."""
    if uri.startswith("sqlite:///"):
        rel = os.path.relpath(uri[len("sqlite:///") :])
        uri = f"sqlite:///{rel}" if not rel.startswith("..") else uri
    return f".venv/bin/mlflow ui --backend-store-uri {uri} --port 5000"


def _param(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return "" if value is None else str(value)
