"""Score a table with a registered model on Spark and write the predictions as a Delta table.

The embedded-transform pattern: the model travels to the executors once (``addFile``), each
Python worker loads it once (a per-process cache) and scores Arrow batches of at most
``batch_size`` rows in a ``mapInPandas`` UDF, so memory stays bounded whatever the table's size.
(``mlflow.pyfunc.spark_udf`` does the same for a single output column; it needs
``result_type="array<float>"`` for tensor-signature models, and gives no column checks.)

Example::

    keras-dl predict --model models:/digits@champion --table data/digits --out data/scores
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import tempfile
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from keras_dl.errors import ConfigError, DataError

_MODELS: dict[str, Any] = {}  # per Python worker process: model path -> loaded pyfunc model


@dataclass(frozen=True)
class ScoringPlan:
    """What the UDF needs, all plain data so it pickles to the executors.

    Attributes:
        model_file: Name of the model folder shipped with ``SparkContext.addFile``.
        inputs: ``(column, dtype, width)`` per model input; width is None for scalar columns.
        frame: Whether the model takes a DataFrame of columns (column signature) rather than
            arrays (tensor signature).
        named: Whether a tensor-signature model takes a dict keyed by input name.
        keys: Columns copied through to the output.
        classes: Class labels, when the model classifies and the run recorded them.
        keras_flavor: Whether the model has MLflow's Keras flavor (scored by a direct call).
    """

    model_file: str
    inputs: tuple[tuple[str, str, int | None], ...]
    frame: bool
    named: bool
    keys: tuple[str, ...]
    classes: tuple = ()
    keras_flavor: bool = False


def predict(
    df,
    model_uri: str,
    features: list[str] | None = None,
    keys: list[str] | None = None,
    batch_size: int = 1024,
    tracking_uri: str | None = None,
):
    """Score a Spark DataFrame with a registered model.

    Args:
        df: The rows to score; must hold the model's input columns.
        model_uri: ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` (resolved once, here).
        features: Input column for a model whose signature has one unnamed tensor. Defaults to
            the ``data.features`` the model was trained with.
        keys: Columns copied to the output. Defaults to every scalar column that is not an input.
        batch_size: Most rows per Arrow batch given to the model. Defaults to 1024.
        tracking_uri: MLflow tracking URI. Defaults to ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db``.

    Returns:
        A DataFrame of ``keys`` + ``prediction`` (+ ``probability_<class>`` columns for a
        classifier).

    Raises:
        DataError: When the DataFrame lacks the model's input columns or holds them with other
            types (the message lists expected and found columns).
    """
    import mlflow
    from mlflow.models import Model

    from keras_dl.registry import resolve_model_uri

    if batch_size < 1:  # Spark reads 0 as "no limit": one batch of the whole partition
        raise ConfigError(f"predict batch_size must be >= 1 rows per batch, got {batch_size}.")

    lineage = resolve_model_uri(model_uri, tracking_uri)
    pinned = f"models:/{lineage.name}/{lineage.version}"
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=pinned, dst_path=os.path.join(tempfile.mkdtemp(), f"model-{uuid.uuid4().hex}")
    )
    logged = Model.load(local)
    signature = logged.signature
    if signature is None:
        raise DataError(
            f"Model {pinned} was logged without a signature, so its input columns are unknown. "
            "Log it with one (keras_dl.tracking.log_keras_model does)."
        )
    run = mlflow.MlflowClient().get_run(lineage.run_id) if lineage.run_id else None
    trained_on = (run.data.params.get("data.features", "") if run else "").split(",")
    classes = tuple(json.loads(run.data.tags.get("keras_dl.classes", "[]"))) if run else ()
    plan = _plan(df, signature, pinned, features or [f for f in trained_on if f], keys)
    plan = dataclasses.replace(
        plan,
        classes=classes,
        model_file=os.path.basename(local),
        keras_flavor="keras" in logged.flavors,
    )
    spark = df.sparkSession
    # The model folder travels to every executor once; each worker loads it once.
    spark.sparkContext.addFile(local, recursive=True)
    # Read when the returned DataFrame is computed: it bounds the rows of each pandas batch.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_size))
    width = _output_width(signature)
    columns = list(plan.keys) + [c for c, _, _ in plan.inputs]
    # Positional aliases: PySpark's mapInPandas looks its input columns up by name, unquoted,
    # so a column named "a.b" would not resolve. The UDF gives the names back.
    aliased = df.select(*[quoted(c).alias(f"_kdl_{i}") for i, c in enumerate(columns)])
    return aliased.mapInPandas(
        partial(_score_batches, plan, columns), _output_schema(df, plan, width)
    )


def quoted(column: str):
    """A Spark column by its exact name: dots, spaces and backticks are not syntax here."""
    from pyspark.sql import functions as F

    return F.col("`" + column.replace("`", "``") + "`")


def _plan(df, signature, model_uri: str, features: list[str], keys) -> ScoringPlan:
    """Match the DataFrame's columns to the model signature, or fail listing both."""
    from pyspark.sql import types as T

    found = {f.name: f.dataType for f in df.schema.fields}
    frame = not signature.inputs.is_tensor_spec()  # a column signature: a DataFrame model
    specs = signature.inputs.inputs
    if frame:
        wanted = [(s.name, s.type.to_numpy().name, None) for s in specs]
    else:
        names = [s.name for s in specs]
        if len(specs) == 1 and not names[0]:
            if len(features) != 1:
                raise DataError(
                    f"Model {model_uri} takes one unnamed tensor {specs[0].shape}; say which "
                    f"column holds it with --features COLUMN (found columns: {', '.join(found)})."
                )
            names = features
        wanted = [
            (n, s.type.name, s.shape[1] if len(s.shape) > 1 else None) for n, s in zip(names, specs)
        ]
    missing = [c for c, _, _ in wanted if c not in found]
    wrong = [
        c
        for c, _, width in wanted
        if c in found and isinstance(found[c], T.ArrayType) != (width is not None)
    ]
    if missing or wrong:
        expected = ", ".join(f"{c} ({d}{f'[{w}]' if w else ''})" for c, d, w in wanted)
        got = ", ".join(f"{n} ({t.simpleString()})" for n, t in found.items())
        raise DataError(
            f"The rows do not match the input of model {model_uri}: "
            f"{'missing ' + ', '.join(missing) if missing else ''}"
            f"{'; wrong shape: ' + ', '.join(wrong) if wrong else ''}. Expected columns: "
            f"{expected}. Found columns: {got}. Score a table with those columns, or rename "
            "them (or pass --features for a single-tensor model)."
        )
    inputs = {c for c, _, _ in wanted}
    if keys is None:
        keys = [
            n
            for n, t in found.items()
            if n not in inputs and not isinstance(t, (T.ArrayType, T.MapType, T.BinaryType))
        ]
    absent = [k for k in keys if k not in found]
    if absent:
        raise DataError(
            f"Key column(s) {', '.join(absent)} not found; columns: {', '.join(found)}."
        )
    return ScoringPlan("", tuple(wanted), frame, len(specs) > 1 or bool(specs[0].name), tuple(keys))


def _score_batches(plan: ScoringPlan, columns: list[str], batches):
    """The UDF body, run on the executors: one model per process, one Arrow batch at a time."""
    import numpy as np
    import pandas as pd

    score = load_scorer(plan.model_file, plan.keras_flavor)
    for pdf in batches:
        pdf.columns = columns  # the real column names, behind their positional aliases
        out = pdf[list(plan.keys)].reset_index(drop=True)
        if len(pdf) == 0:
            continue
        scores = np.asarray(score(_model_input(pdf, plan)), dtype=np.float32)
        if scores.ndim == 2 and scores.shape[1] > 1:
            index = scores.argmax(1)
            out["prediction"] = np.asarray(plan.classes)[index] if plan.classes else index
            probs = pd.DataFrame(scores, columns=_probability_columns(plan, scores.shape[1]))
            out = pd.concat([out, probs], axis=1)
        else:
            out["prediction"] = scores.reshape(len(pdf)).astype(np.float64)
        yield out


def _model_input(pdf, plan: ScoringPlan):
    import numpy as np

    if plan.frame:
        return pdf[[c for c, _, _ in plan.inputs]]
    arrays = {}
    for column, dtype, width in plan.inputs:
        values = pdf[column].to_numpy()
        if width is not None:
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

    A Keras-flavor model is called directly inside a ``tf.function``: pyfunc's
    ``model.predict`` runs 32-row steps and builds a pipeline per call, about 5x slower per
    1,024-row batch here, for the same numbers. Inputs were already checked and cast to the
    signature by the caller. Other models go through their pyfunc ``predict``.

    Args:
        model_file: Name of an MLflow model folder, or of a ``.keras`` file (the Spark ML
            ``KerasModel``), shipped with ``SparkContext.addFile``.
        keras_flavor: Whether the folder has MLflow's Keras flavor (ignored for ``.keras``).
    """
    import keras
    import mlflow
    from pyspark import SparkFiles

    path = SparkFiles.get(model_file)
    if path not in _MODELS:
        keras.utils.disable_interactive_logging()  # no progress bars in executor logs
        if keras_flavor or path.endswith(".keras"):
            import tensorflow as tf

            if path.endswith(".keras"):
                model = keras.saving.load_model(path, compile=False)
            else:
                model = mlflow.keras.load_model(path)
            call = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
            _MODELS[path] = lambda x: call(x).numpy()
        else:
            _MODELS[path] = mlflow.pyfunc.load_model(path).predict
    return _MODELS[path]


def _output_width(signature) -> int:
    shape = signature.outputs.inputs[0].shape if signature.outputs else (-1, 1)
    return int(shape[1]) if len(shape) > 1 else 1


def _output_schema(df, plan: ScoringPlan, width: int):
    from pyspark.sql import types as T

    fields = [df.schema[k] for k in plan.keys]
    if width > 1:
        first = plan.classes[0] if plan.classes else 0
        kind = (
            T.StringType()
            if isinstance(first, str)
            else T.BooleanType()
            if isinstance(first, bool)
            else T.LongType()
        )
        fields.append(T.StructField("prediction", kind))
        fields += [T.StructField(c, T.FloatType()) for c in _probability_columns(plan, width)]
    else:
        fields.append(T.StructField("prediction", T.DoubleType()))
    return T.StructType(fields)


def _probability_columns(plan: ScoringPlan, width: int) -> list[str]:
    names = plan.classes if len(plan.classes) == width else range(width)
    return [f"probability_{re.sub(r'[^0-9A-Za-z_]', '_', str(n))}" for n in names]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl predict`` arguments."""
    p.add_argument("--model", required=True, help="models:/NAME/VERSION or models:/NAME@ALIAS")
    p.add_argument("--table", required=True, help="Delta table or Parquet path to score")
    p.add_argument("--version", type=int, default=None, help="Delta version of --table")
    p.add_argument("--out", required=True, help="Delta table to write the predictions to")
    p.add_argument("--mode", default="error", choices=["error", "append", "overwrite"])
    p.add_argument("--key", action="append", default=None, help="key column (repeatable)")
    p.add_argument("--features", default=None, help="input column of a single-tensor model")
    p.add_argument(
        "--batch-size", type=_positive_int, default=1024, help="rows per Arrow batch (>= 1)"
    )
    p.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI")


def run(args: argparse.Namespace) -> int:
    """``keras-dl predict``: read the table into Spark, score it, write a Delta table."""
    from keras_dl.inference_io import read_table_into_spark, spark_session, write_predictions
    from keras_dl.storage import check_safe_delta_writes

    check_safe_delta_writes(args.out)  # before any scoring
    spark = spark_session(args.master)
    try:
        df, snapshot = read_table_into_spark(spark, args.table, args.version)
        scored = predict(
            df,
            args.model,
            features=[args.features] if args.features else None,
            keys=args.key,
            batch_size=args.batch_size,
            tracking_uri=args.tracking_uri,
        )
        report = write_predictions(scored, args.out, mode=args.mode)
    finally:
        spark.stop()
    print(
        f"scored {report.rows} rows of {snapshot.uri} (version {snapshot.version}) with "
        f"{args.model}: wrote {report.files} file(s) to Delta table {args.out} version "
        f"{report.version}"
    )
    return 0


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value
