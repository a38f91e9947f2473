"""Logging a Keras model so that it loads anywhere its own ``requirements.txt`` is installed.

Every model is logged with :mod:`keras_dl.model.pyfunc` as its pyfunc ``loader_module``,
shipped in the model's ``code/`` folder (``code_paths``): that standalone module, not keras_dl,
is what MLflow imports to load it, and its ``predict`` refuses null and NaN features (or imputes
a column the model declares optional). Two kinds:

- A model whose inputs are named scalar columns (a table model) gets a column-based signature
  (one typed column per input; an optional column is declared ``required=False``): MLflow's
  Keras flavor cannot feed Keras 3 string columns, so it has the pyfunc flavor only.
- Any other model keeps MLflow's Keras flavor (``mlflow.keras.load_model`` works) and a tensor
  signature; only its pyfunc flavor is pointed at the shipped loader.

A recipe declares optional columns by setting :data:`IMPUTE_ATTRIBUTE` on the model it builds:
``{column: training-time fill value}``, written to the model's ``keras_dl.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from typing import Any

from keras_dl.data.stream.packing import input_name, is_packed
from keras_dl.model import pyfunc
from keras_dl.tracking import models as tracked

IMPUTE_ATTRIBUTE = pyfunc.IMPUTE_ATTRIBUTE
LOADER = pyfunc.LOADER


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


def serving_model(model: Any, plan) -> Any:
    """``model`` taking named columns where it takes packed features (``plan``, a
    :class:`~keras_dl.data.stream.features.ColumnPlan`): one scalar input per member, stacked in member
    order into the packed ``(k,)`` tensor. The trained model inside is shared (same weights,
    none added), so this is what is logged and scored; training keeps the packed ``model``. A
    model without packed features is returned as it is."""
    import keras

    if not is_packed(plan):
        return model
    inputs, feed = {}, {}
    for spec in plan.features:
        if not spec.members:
            declared = model.input[spec.name]
            inputs[spec.name] = feed[spec.name] = keras.Input(
                shape=declared.shape[1:], dtype=declared.dtype, name=input_name(spec.name)
            )
            continue
        for name in spec.members:
            inputs[name] = keras.Input(shape=(), dtype=spec.dtype, name=input_name(name))
        columns = [  # layer names start with "__packed_", which no column may (pack_features)
            keras.layers.Reshape((1,), name=f"{spec.name}_{j}")(inputs[name])
            for j, name in enumerate(spec.members)
        ]
        feed[spec.name] = keras.layers.Concatenate(name=spec.name)(columns)
    with warnings.catch_warnings():  # inputs keyed by column, named without "/": intended
        warnings.filterwarnings("ignore", message="When providing `inputs` as a dict")
        serving = keras.Model(inputs, model(feed), name=model.name)
    impute = getattr(model, IMPUTE_ATTRIBUTE, None)
    if impute:
        setattr(serving, IMPUTE_ATTRIBUTE, impute)
    return serving


def packed_input_model(model: Any, plan) -> Any:
    """A model taking named columns (a logged model, e.g. the registry champion) fed what a
    packed dataset yields: each packed feature split into its member columns. ``model`` as it
    is when ``plan`` packs nothing or it already takes the packed features."""
    import keras

    declared = getattr(model, "input", None)
    packed = [s for s in plan.features if s.members]
    if not packed or not isinstance(declared, dict) or any(s.name in declared for s in packed):
        return model
    inputs, feed = {}, {}
    for spec in plan.features:
        if not spec.members:
            t = declared[spec.name]
            inputs[spec.name] = feed[spec.name] = keras.Input(
                shape=t.shape[1:], dtype=t.dtype, name=input_name(spec.name)
            )
            continue
        inputs[spec.name] = x = keras.Input(
            shape=spec.shape, dtype=spec.dtype, name=input_name(spec.name)
        )
        for j, name in enumerate(spec.members):
            feed[name] = keras.ops.cast(x[:, j], declared[name].dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="When providing `inputs` as a dict")
        return keras.Model(inputs, model(feed), name=model.name)


def is_frame_input(sample_input: Any) -> bool:
    """Whether a model input sample is a dict of 1-D arrays: one scalar column per input."""
    import numpy as np

    return isinstance(sample_input, dict) and all(
        np.asarray(v).ndim == 1 for v in sample_input.values()
    )


def log_model(model: Any, signature, frame: bool, input_example: Any = None):
    """Log ``model`` to the active run with the shipped loader; returns MLflow's ``ModelInfo``.

    Args:
        model: A Keras 3 model (with :data:`IMPUTE_ATTRIBUTE` when it has optional columns).
        signature: Its signature (column-based when ``frame``, else tensor-based).
        frame: Whether it is a table model (pyfunc only) or keeps the Keras flavor.
        input_example: A row or two of real input (a DataFrame when ``frame``, else an array),
            saved with the model; MLflow checks the model scores it. Defaults to None.
    """
    return tracked.log_model(
        _Flavor,
        keras_model=model,
        frame=frame,
        signature=signature,
        input_example=input_example,
        pip_requirements=model_requirements(),
    )


class _Flavor:
    """What ``Model.log`` calls to write the model folder (a flavor module's interface)."""

    __name__ = "keras_dl"

    @staticmethod
    def save_model(
        path, mlflow_model, keras_model, frame, signature, pip_requirements, input_example=None
    ):
        if frame:
            with tempfile.TemporaryDirectory() as tmp:
                code = os.path.join(tmp, f"{LOADER}.py")  # the loader's name in code/
                shutil.copy(pyfunc.__file__, code)
                data = os.path.join(tmp, "data")
                _write_data(keras_model, data)
                tracked.save_pyfunc_model(
                    path,
                    loader_module=LOADER,
                    data_path=data,
                    code_paths=[code],
                    mlflow_model=mlflow_model,
                    signature=signature,
                    input_example=input_example,
                    pip_requirements=pip_requirements,
                )
            return
        os.makedirs(path, exist_ok=True)  # MLflow's Keras flavor writes the example before it
        tracked.save_keras_model(
            keras_model,
            path,
            mlflow_model=mlflow_model,
            signature=signature,
            input_example=input_example,
            pip_requirements=pip_requirements,
        )
        _write_data(keras_model, os.path.join(path, "data"), model_file=False)
        os.makedirs(os.path.join(path, "code"))
        shutil.copy(pyfunc.__file__, os.path.join(path, "code", f"{LOADER}.py"))
        conf = mlflow_model.flavors["python_function"]
        conf.update(loader_module=LOADER, data="data", code="code")
        mlflow_model.save(os.path.join(path, "MLmodel"))


def _write_data(model: Any, folder: str, model_file: bool = True) -> None:
    """``model.keras`` and ``keras_dl.json`` (the optional columns' fill values) in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    if model_file:
        model.save(os.path.join(folder, pyfunc.MODEL_FILE))
    spec = {"impute": dict(getattr(model, IMPUTE_ATTRIBUTE, None) or {})}
    with open(os.path.join(folder, pyfunc.SPEC_FILE), "w") as f:
        json.dump(spec, f, indent=1, sort_keys=True)


def frame_signature(model: Any, sample_input: dict):
    """The column-based signature of a table model: one typed column per input, optional
    columns (those with a fill value) declared ``required=False``."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame({k: _widen(np.asarray(v)) for k, v in sample_input.items()})
    prediction = model.predict(to_model_inputs(model, frame), verbose=0)
    if isinstance(prediction, dict):  # one output head per label: one column each
        prediction = pyfunc.to_columns(prediction)
    else:
        prediction = np.asarray(prediction)
    optional = set(getattr(model, IMPUTE_ATTRIBUTE, None) or {})
    return tracked.column_signature(frame, prediction, optional)


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
