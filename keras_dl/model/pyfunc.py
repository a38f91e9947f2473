"""The pyfunc loader shipped inside every model keras_dl logs (the model's ``code/`` folder).

A logged model's ``python_function`` flavor names this module as its ``loader_module``, and MLflow
puts the model's ``code/`` folder on ``sys.path`` before importing it, so the model loads wherever
its own ``requirements.txt`` is installed (mlflow, keras, tensorflow, numpy, pandas): keras_dl is
not needed. That is why this file imports nothing from keras_dl and stays standalone. Nothing
data-derived runs as code: what the model learned is in ``model.keras`` and ``keras_dl.json``
(plain JSON: the columns declared optional and their training-time fill values).

``predict`` refuses a null or NaN feature with an ``MlflowException`` (INVALID_PARAMETER_VALUE,
so ``mlflow models serve`` answers HTTP 400) that names the column and the row, unless the column
is declared optional: then the missing value is replaced by its training-time statistic.

A model with several outputs (one head per label) predicts a DataFrame with one column per
head, named after its output: a regression head's value, or a classifier head's probabilities
(a list per row).
"""

from __future__ import annotations

import json
import os

LOADER = "keras_dl_pyfunc"  # its module name in a model's code/ folder (code/keras_dl_pyfunc.py)
MODEL_FILE = "model.keras"
SPEC_FILE = "keras_dl.json"
# A recipe declares optional columns by setting this attribute on the model it builds:
# {column: training-time fill value}; keras_dl.model.log writes it to SPEC_FILE.
IMPUTE_ATTRIBUTE = "keras_dl_impute"


def _load_pyfunc(data_path: str) -> KerasDLModel:
    """MLflow's entry point: ``data_path`` is the folder holding ``model.keras``."""
    return KerasDLModel(data_path)


class KerasDLModel:
    """A Keras model scored from a DataFrame (one column per named input) or from tensors."""

    def __init__(self, folder: str):
        import keras

        spec_file = os.path.join(folder, SPEC_FILE)
        spec = {}
        if os.path.exists(spec_file):
            with open(spec_file) as f:
                spec = json.load(f)
        self.impute: dict = dict(spec.get("impute", {}))
        self.model = keras.saving.load_model(os.path.join(folder, MODEL_FILE), compile=False)

    def get_raw_model(self):
        """The Keras model (``PyFuncModel.get_raw_model``)."""
        return self.model

    def predict(self, model_input, params=None):
        """Probabilities (classification) or values (regression) as a numpy array; for a model
        with several outputs, a DataFrame with one column per output (see :func:`to_columns`)."""
        import numpy as np

        inputs = self.prepare(model_input)
        rows = len(next(iter(inputs.values())) if isinstance(inputs, dict) else inputs)
        out = self.model.predict(inputs, batch_size=max(1, min(rows, 4096)), verbose=0)
        if isinstance(out, dict):
            return to_columns(out)
        return np.asarray(out)

    def prepare(self, model_input):
        """The model's inputs from a DataFrame, a dict of arrays or an array: missing values
        refused or imputed, each input cast to the dtype the model declares."""
        import pandas as pd

        try:
            declared = self.model.input
        except AttributeError:  # a Sequential built by fit, without an Input: one float tensor
            declared = None
        named = isinstance(declared, dict)
        if named:  # keyed by column name (a layer's name may differ: Keras refuses "/")
            dtypes = {n: t.dtype for n, t in declared.items()}
        elif declared is not None:
            dtypes = {self.model.inputs[0].name: self.model.inputs[0].dtype}
        else:
            dtypes = {"input": "float32"}
        names = list(dtypes)
        if isinstance(model_input, pd.DataFrame):
            if named:
                columns = {n: model_input.get(n) for n in names}
            else:  # one tensor input given as a frame: its columns are the tensor's values
                columns = {names[0]: model_input.to_numpy()}
        elif isinstance(model_input, dict):
            columns = {n: model_input.get(n) for n in names}
        else:
            columns = {names[0]: model_input}
        rows = max((len(v) for v in columns.values() if v is not None), default=len(model_input))
        out = {}
        for name, values in columns.items():
            if values is None:  # an optional column left out of the request
                values = pd.Series([None] * rows, dtype=object)
            out[name] = self._column(name, values, dtypes[name])
        if named:
            return out
        return out[names[0]]

    def _column(self, name: str, values, dtype: str):
        import numpy as np
        import pandas as pd

        if isinstance(values, pd.Series):
            values = values.to_numpy()
        values = np.asarray(values)
        if values.dtype.kind == "O" and values.ndim == 1 and len(values) and _is_array(values[0]):
            values = np.stack([np.asarray(v, dtype=object) for v in values])
        missing = _missing(values)
        if missing.any():
            if name not in self.impute:
                raise _refusal(name, missing, list(self.impute))
            values = np.where(missing, self.impute[name], values)
        if dtype == "string":
            import tensorflow as tf

            text = [v.decode() if isinstance(v, bytes) else str(v) for v in values.ravel()]
            return tf.constant(np.array(text, dtype=object).reshape(values.shape), tf.string)
        return np.asarray(values, dtype=dtype)


def to_columns(outputs: dict):
    """A DataFrame of a several-output model's predictions, one column per output: a value per
    row for a one-wide output (float64), else the row's values as a list (probabilities)."""
    import numpy as np
    import pandas as pd

    columns = {}
    for name, values in outputs.items():
        values = np.asarray(values)
        flat = values.reshape(len(values), -1)
        if flat.shape[1] == 1:
            columns[name] = flat[:, 0].astype(np.float64)
        else:
            columns[name] = list(flat.astype(np.float64))
    return pd.DataFrame(columns)


def _is_array(value) -> bool:
    return isinstance(value, (list, tuple)) or hasattr(value, "__array__")


def _missing(values):
    """Per value: None, NaN or pandas' NA."""
    import numpy as np
    import pandas as pd

    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind == "O":
        return np.asarray(pd.isna(values), dtype=bool)
    return np.zeros(values.shape, dtype=bool)


def _refusal(name: str, missing, optional: list):
    """The error for a missing feature: the column, the first rows, and the fix."""
    import numpy as np
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    per_row = missing.reshape(len(missing), -1).any(axis=1)
    bad = np.flatnonzero(per_row)
    where = ", ".join(str(int(i)) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
    declared = f" The model's optional columns: {', '.join(optional)}." if optional else ""
    return MlflowException(
        f"Column {name!r} has a missing value (null or NaN) in {len(bad)} row(s) (row {where}). "
        f"This model does not impute {name!r}: send a value for every row, or train a model that "
        f"declares the column optional (the tabular recipe's model.optional).{declared}",
        error_code=INVALID_PARAMETER_VALUE,
    )
