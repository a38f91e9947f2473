"""Score a Spark DataFrame with a registered model: the driver side of batch inference.

:func:`predict` resolves the model URI once, downloads the model, matches the rows to its
signature (:mod:`keras_dl.inference.plan`), ships the model folder to the executors as an
archive (:func:`keras_dl.connect.ship_folder`: ``addArchive`` on a classic session,
``addArtifacts`` on Spark Connect) and maps :func:`keras_dl.inference.executor.score_batches` over Arrow batches of at
most ``batch_size`` rows. (``mlflow.pyfunc.spark_udf`` does the same for a single output column;
it needs ``result_type="array<float>"`` for tensor-signature models, and gives no column checks.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import uuid
from functools import partial

from keras_dl.connect import ship_folder
from keras_dl.errors import ConfigError, DataError
from keras_dl.inference.executor import score_batches
from keras_dl.inference.plan import make_plan, output_schema, output_width


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
    from keras_dl import tracking
    from keras_dl.model.registry import resolve_model_uri

    if batch_size < 1:  # Spark reads 0 as "no limit": one batch of the whole partition
        raise ConfigError(f"predict batch_size must be >= 1 rows per batch, got {batch_size}.")

    lineage = resolve_model_uri(model_uri, tracking_uri)
    pinned = f"models:/{lineage.name}/{lineage.version}"
    local = tracking.download_artifacts(
        artifact_uri=pinned, dst_path=os.path.join(tempfile.mkdtemp(), f"model-{uuid.uuid4().hex}")
    )
    logged = tracking.logged_model(local)
    signature = logged.signature
    if signature is None:
        raise DataError(
            f"Model {pinned} was logged without a signature, so its input columns are unknown. "
            "Log it with one (keras_dl.model.publish.log_keras_model does)."
        )
    run = tracking.client().get_run(lineage.run_id) if lineage.run_id else None
    trained_on = (run.data.params.get("data.features", "") if run else "").split(",")
    classes = json.loads(run.data.tags.get("keras_dl.classes", "[]")) if run else []
    heads = ()
    if isinstance(classes, dict):  # several labels: the classes of each head, by label
        outputs = [c.name for c in signature.outputs.inputs] if signature.outputs else []
        heads = tuple((h, tuple(classes.get(h, ()))) for h in outputs)
        classes = []
    plan = make_plan(df, signature, pinned, features or [f for f in trained_on if f], keys)
    spark = df.sparkSession
    # The model folder travels to every executor once; each worker loads it once.
    plan = dataclasses.replace(
        plan,
        classes=tuple(classes),
        heads=heads,
        model_file=ship_folder(spark, local),
        keras_flavor="keras" in logged.flavors,
    )
    # Read when the returned DataFrame is computed: it bounds the rows of each pandas batch.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_size))
    width = 1 if heads else output_width(signature)  # several heads: one column spec each
    # A key may also be a model input: each column is selected once.
    columns = list(dict.fromkeys([*plan.keys, *(c for c, _, _ in plan.inputs)]))
    # Positional aliases: PySpark's mapInPandas looks its input columns up by name, unquoted,
    # so a column named "a.b" would not resolve. The UDF gives the names back.
    aliased = df.select(*[quoted(c).alias(f"_kdl_{i}") for i, c in enumerate(columns)])
    return aliased.mapInPandas(
        partial(score_batches, plan, columns), output_schema(df, plan, width)
    )


def quoted(column: str):
    """A Spark column by its exact name: dots, spaces and backticks are not syntax here."""
    from pyspark.sql import functions as F

    return F.col("`" + column.replace("`", "``") + "`")
