"""A trained model into the run and the registry: logged with its signature and input example,
registered as a version with its lineage tags and git commit.

The model folder itself (the flavor, the pyfunc loader in ``code/``) is :mod:`keras_dl.model.log`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keras_dl import tracking
from keras_dl.tracking import git_tags


def log_keras_model(
    model: Any,
    sample_input: Any,
    registered_model: str | None,
    tags: Mapping[str, str] = (),
    description: str | None = None,
) -> tuple[str, int | None]:
    """Log ``model`` to the active run with a signature inferred from ``sample_input``.

    Every model loads without keras_dl: its pyfunc loader (:mod:`keras_dl.model.pyfunc`)
    travels in its ``code/`` folder, and refuses null and NaN features. A model whose inputs are
    named scalar columns (a dict of 1-D arrays) gets a column-based signature and the pyfunc
    flavor only, because MLflow's Keras flavor cannot feed string columns to Keras 3; any other
    keeps the Keras flavor beside it, with a tensor signature (:mod:`keras_dl.model.log`).

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
    from keras_dl.model.log import frame_signature, is_frame_input, log_model

    register = registered_model if registered_model and registered_model != "none" else None
    example = input_example(sample_input)
    if is_frame_input(sample_input):
        info = log_model(model, frame_signature(model, sample_input), True, example)
    else:
        prediction = model.predict(sample_input, verbose=0)
        info = log_model(model, make_signature(sample_input, prediction), False, example)
    if register is None:
        return info.model_uri, None
    return info.model_uri, register_model(info.model_uri, register, tags, description)


def input_example(sample_input: Any, rows: int = 2) -> Any:
    """The model's ``input_example``: the first ``rows`` rows of ``sample_input`` (real rows of
    the training table), one for an image or other input over 1,000 values a row.

    A dict of columns becomes a DataFrame (the form a table model is scored in); an array stays
    an array (the Keras flavor's tensor input).
    """
    import numpy as np
    import pandas as pd

    if isinstance(sample_input, Mapping):
        return pd.DataFrame({k: list(np.asarray(v)[:rows]) for k, v in sample_input.items()})
    array = np.asarray(sample_input)
    return array[: 1 if array[:1].size > 1000 else rows]


def register_model(
    model_uri: str, name: str, tags: Mapping[str, str] = (), description: str | None = None
) -> int:
    """Register a logged model as a new version of ``name``; return the version.

    Args:
        model_uri: The logged model (``models:/m-...`` or ``runs:/RUN/model``).
        name: The registered model's name.
        tags: Tags set on the version (lineage); the git commit is added. Defaults to none.
        description: The version's description. Defaults to None.
    """
    version = tracking.register_model(model_uri, name)
    client = tracking.client()
    for key, value in {**dict(tags), **git_tags()}.items():
        client.set_model_version_tag(name, str(version), key, str(value))
    if description:
        client.update_model_version(name, str(version), description=description)
    return int(version)


def make_signature(sample_input: Any, prediction: Any):
    """The model signature for ``sample_input``: MLflow's inferred tensor signature, except that
    floating-point inputs are declared float64.

    MLflow's Keras flavor requires tensor signatures, and tensor inputs must match the declared
    dtype exactly. pandas holds floats as float64, so declaring float64 lets a DataFrame of raw
    values score as is; the model casts to its own input dtype.
    """
    import numpy as np

    def widen(x):
        x = np.asarray(x)
        return x.astype(np.float64) if x.dtype.kind == "f" else x

    if isinstance(sample_input, dict):
        sample = {k: widen(v) for k, v in sample_input.items()}
    else:
        sample = widen(sample_input)
    return tracking.infer_signature(
        sample, np.asarray(prediction) if not isinstance(prediction, dict) else prediction
    )
