"""A Keras model whose inputs are named table columns, as an MLflow pyfunc that takes a DataFrame.

MLflow's Keras flavor feeds ``model.predict`` numpy arrays, and Keras 3 rejects numpy string
arrays ("Invalid dtype: str"), so a model with a ``StringLookup`` on a raw string column cannot be
served by it. This pyfunc converts each column to a tensor of the model input's dtype first, and
declares a column-based signature (one typed column per input), which is what a table model's
callers have: a DataFrame, a Spark row, a ``dataframe_split`` JSON request.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import mlflow.pyfunc


class KerasFrameModel(mlflow.pyfunc.PythonModel):
    """Scores a DataFrame of raw columns with a Keras model that has one input per column."""

    def load_context(self, context) -> None:
        import keras

        self.model = keras.saving.load_model(context.artifacts["keras_model"], compile=False)

    def predict(self, context, model_input, params=None):
        """Probabilities (classification) or values (regression) as a float32 numpy array."""
        import numpy as np

        inputs = to_model_inputs(self.model, model_input)
        rows = len(model_input)
        return np.asarray(self.model.predict(inputs, batch_size=max(1, min(rows, 4096)), verbose=0))


def to_model_inputs(model: Any, frame) -> dict:
    """``{input name: tensor}`` from a DataFrame, each column cast to its input's dtype."""
    import numpy as np
    import tensorflow as tf

    out = {}
    for name, tensor in model.input.items():
        column = frame[name]
        if tensor.dtype == "string":
            out[name] = tf.constant(column.astype(str).to_numpy(dtype=object), tf.string)
        else:
            out[name] = tf.constant(np.asarray(column.to_numpy(), dtype=tensor.dtype))
    return out


def is_frame_input(sample_input: Any) -> bool:
    """Whether a model input sample is a dict of 1-D arrays: one scalar column per input."""
    import numpy as np

    return isinstance(sample_input, dict) and all(
        np.asarray(v).ndim == 1 for v in sample_input.values()
    )


def log_frame_model(model: Any, sample_input: dict):
    """Log ``model`` to the active run as a :class:`KerasFrameModel` with a column signature.

    Returns:
        The MLflow ``ModelInfo`` (registration is :func:`keras_dl.tracking.register_model`'s).
    """
    import numpy as np
    import pandas as pd
    from mlflow.models import infer_signature

    frame = pd.DataFrame({k: _widen(np.asarray(v)) for k, v in sample_input.items()})
    prediction = model.predict(to_model_inputs(model, frame), verbose=0)
    signature = infer_signature(frame, np.asarray(prediction))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        return mlflow.pyfunc.log_model(
            name="model",
            python_model=KerasFrameModel(),
            artifacts={"keras_model": path},
            signature=signature,
            pip_requirements=model_requirements(),
        )


def _widen(values):
    """Declare pandas' own types: float64, int64, str (bytes from tf.data decoded)."""
    import numpy as np

    if values.dtype.kind == "f":
        return values.astype(np.float64)
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    if values.dtype.kind in "OSU":
        return np.array([v.decode() if isinstance(v, bytes) else str(v) for v in values], object)
    return values


def model_requirements() -> list[str]:
    """The pip requirements of a logged model: the installed mlflow, keras, TensorFlow, numpy
    and pandas.

    Given explicitly because MLflow's inference of them re-imports the model in a subprocess,
    which took about 15 s per logged model here.
    """
    from importlib import metadata

    out = []
    for dist in ("mlflow", "keras", "tensorflow", "tensorflow-cpu", "numpy", "pandas"):
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return out
