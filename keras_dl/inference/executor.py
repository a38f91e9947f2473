"""The executor side of scoring: the model loaded once per Python worker, Arrow batches scored.

:func:`score_batches` is the ``mapInPandas`` UDF body; :func:`load_scorer` loads the model
shipped with :mod:`keras_dl.connect` (a file or a folder's archive) once per process (the Spark ML ``KerasModel`` uses it too).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from keras_dl import tracking
from keras_dl.distribute.gpus import use_task_gpus
from keras_dl.errors import DataError
from keras_dl.inference.plan import ScoringPlan, head_columns, probability_columns
from keras_dl.model.pyfunc import LOADER, KerasDLModel

_MODELS: dict[str, Any] = {}  # per Python worker process: model path -> loaded pyfunc model


def score_batches(plan: ScoringPlan, columns: list[str], batches):
    """The UDF body, run on the executors: one model per process, one Arrow batch at a time."""
    import numpy as np
    import pandas as pd

    score = load_scorer(plan.model_file, plan.keras_flavor)
    for pdf in batches:
        pdf.columns = columns  # the real column names, behind their positional aliases
        out = pdf[list(plan.keys)].reset_index(drop=True)
        if len(pdf) == 0:
            continue
        if plan.heads:
            yield _by_head(out, score(_model_input(pdf, plan)), plan)
            continue
        scores = np.asarray(score(_model_input(pdf, plan)), dtype=np.float32)
        if scores.ndim == 2 and scores.shape[1] > 1:
            index = scores.argmax(1)
            out["prediction"] = np.asarray(plan.classes)[index] if plan.classes else index
            probs = pd.DataFrame(scores, columns=probability_columns(plan, scores.shape[1]))
            out = pd.concat([out, probs], axis=1)
        else:
            out["prediction"] = scores.reshape(len(pdf)).astype(np.float64)
        yield out


def _by_head(out, scores, plan: ScoringPlan):
    """``prediction_<head>`` per head (the class, or the value), and a classifier head's
    probabilities. ``scores``: a dict of arrays (direct call) or the pyfunc's DataFrame."""
    import numpy as np
    import pandas as pd

    for head, classes in plan.heads:
        values = scores[head]
        if isinstance(values, pd.Series):  # the pyfunc's DataFrame: lists per row
            values = np.stack(values.to_numpy()) if values.dtype == object else values.to_numpy()
        values = np.asarray(values, dtype=np.float32).reshape(len(out), -1)
        if classes:
            out[f"prediction_{head}"] = np.asarray(classes)[values.argmax(1)]
            probs = pd.DataFrame(values, columns=head_columns(head, classes))
            out = pd.concat([out, probs], axis=1)
        else:
            out[f"prediction_{head}"] = values[:, 0].astype(np.float64)
    return out


def _model_input(pdf, plan: ScoringPlan):
    import numpy as np

    if plan.frame:
        return pdf[[c for c, _, _ in plan.inputs]]
    arrays = {}
    for column, dtype, width in plan.inputs:
        values = pdf[column].to_numpy()
        if width is not None:
            if pdf[column].isna().any():
                raise DataError(_null_rows(column, pdf[column].isna().to_numpy()))
            values = np.stack(values)
            if values.shape[1] != width:
                raise DataError(
                    f"Column {column!r} holds lists of {values.shape[1]} values; the model "
                    f"expects {width}."
                )
        arrays[column] = values.astype(dtype)
    return arrays if plan.named else next(iter(arrays.values()))


def load_scorer(model_file: str, keras_flavor: bool):
    """``fn(inputs) -> numpy scores`` for the shipped model, loaded once per worker process.

    A model keras_dl logged (its pyfunc loader is :mod:`keras_dl.model.pyfunc`), or one with
    MLflow's Keras flavor, is called directly inside a ``tf.function`` after the loader's own
    ``prepare`` (which refuses null and NaN features, or imputes optional columns): pyfunc's
    ``model.predict`` runs 32-row steps and builds a pipeline per call, about 5x slower per
    1,024-row batch here, for the same numbers. Inputs were already checked and cast to the
    signature by the caller. Other models go through their pyfunc ``predict``.

    Args:
        model_file: Name of an MLflow model folder's archive, or of a ``.keras`` file (the
            Spark ML ``KerasModel``), shipped with :mod:`keras_dl.connect`; ``SparkFiles.get``
            finds either on a classic or a Spark Connect session.
        keras_flavor: Whether the folder has MLflow's Keras flavor (ignored for ``.keras``;
            a folder's pyfunc loader is read from its MLmodel).
    """
    use_task_gpus()  # this task's GPUs only, before TensorFlow starts in this worker
    import keras
    from pyspark import SparkFiles

    path = SparkFiles.get(model_file)
    if path not in _MODELS:
        keras.utils.disable_interactive_logging()  # no progress bars in executor logs
        conf = {} if path.endswith(".keras") else _pyfunc_conf(path)
        if path.endswith(".keras") or conf.get("loader_module") in DIRECT:
            import tensorflow as tf

            if path.endswith(".keras"):
                model = keras.saving.load_model(path, compile=False)
                prepare = None
            else:
                loaded = KerasDLModel(os.path.join(path, conf.get("data") or "data"))
                model, prepare = loaded.model, loaded.prepare
            call = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
            _MODELS[path] = partial(_direct, call, prepare)
        else:
            _MODELS[path] = tracking.load_pyfunc_model(path).predict
    return _MODELS[path]


# The pyfunc loaders whose folder holds data/model.keras: keras_dl's own and MLflow's Keras one.
DIRECT = (LOADER, "mlflow.keras")


def _direct(call, prepare, inputs):
    if prepare is not None:
        try:
            inputs = prepare(inputs)
        except Exception as exc:  # MLflow's, a null or NaN feature: the loader's message names it
            if not tracking.is_mlflow_error(exc):
                raise
            raise DataError(exc.message) from None
    out = call(inputs)
    if isinstance(out, dict):  # one output head per label
        return {k: v.numpy() for k, v in out.items()}
    return out.numpy()


def _pyfunc_conf(path: str) -> dict:
    return tracking.logged_model(os.path.join(path, "MLmodel")).flavors.get("python_function", {})


def _null_rows(column: str, missing) -> str:
    import numpy as np

    rows = ", ".join(str(int(i)) for i in np.flatnonzero(missing)[:5])
    return (
        f"Column {column!r} is null in {int(missing.sum())} row(s) of a batch (row {rows}). "
        "The model has no value to score them with: fill or drop those rows first."
    )
