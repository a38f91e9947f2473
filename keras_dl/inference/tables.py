"""Tables in and out of Spark for batch inference, without Delta's Spark jars.

Spark reads the Parquet files of one table version directly (the file list comes from
``keras_dl.data.tables.open_table``, so Delta time travel works), and the predictions are
written with ``deltalake``. On a Spark that has Delta, read with ``spark.read.format("delta")``
and write ``keras_dl.inference.predict``'s DataFrame with ``df.write.format("delta")`` instead.
"""

from __future__ import annotations

import os
import sys

from keras_dl.connect import default_parallelism
from keras_dl.errors import DataError
from keras_dl.extras import import_extra


def spark_session(
    master: str = "local[*]",
    app_name: str = "keras-dl",
    *,
    bind_address: str = "127.0.0.1",
    ui: bool = False,
):
    """A Spark session with Arrow on and executors on this Python interpreter.

    A ``master`` of the form ``sc://host:port/;token=...`` connects to that Spark Connect
    server instead (a Databricks shared or serverless cluster, a Spark 4 Connect server): the
    server owns the executors and the static settings, so only Arrow and the shuffle width are
    set, per session.

    Args:
        master: Spark master URL, or a Spark Connect URL ``sc://...``. Defaults to "local[*]".
        app_name: Application name. Defaults to "keras-dl".
        bind_address: Where the driver listens on a local master (``runtime.bind_address``).
            Defaults to "127.0.0.1".
        ui: Start Spark's web UI (``runtime.spark_ui``). Defaults to False.
    """
    # Workers must run the interpreter that has keras_dl, TensorFlow and MLflow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import_extra("pyspark", "keras-dl predict (it scores on Spark)")
    from pyspark.sql import SparkSession

    from keras_dl.distribute.loopback import spark_conf

    if master.startswith("sc://"):
        spark = SparkSession.builder.remote(master).getOrCreate()
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        return spark
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", "4")
    )
    for key, value in spark_conf(master, bind_address=bind_address, ui=ui).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def read_table_into_spark(spark, table: str, version: int | None = None):
    """One version of a Delta table (or a Parquet table) as a Spark DataFrame.

    Spark schedules and the executors read: each task loads its files' row groups with
    :func:`keras_dl.data.tables.rows.load_row_group`, the loader the Petastorm workers use for
    training, so scoring sees exactly the rows training sees (deletion vectors applied,
    column mapping resolved, partition values typed). Spark's own Parquet reader would not:
    it knows neither the Delta log nor deletion vectors.

    Returns:
        The DataFrame and the table's snapshot (for its URI and version).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    from keras_dl.data.tables import open_table
    from keras_dl.storage import environment

    snapshot = open_table(table, version)
    if not snapshot.files:
        raise DataError(f"Table {snapshot.uri!r} (version {snapshot.version}) has no data files.")
    names = list(snapshot.schema.names)
    settings = environment()

    def read_files(batches):  # runs in the executors: one task reads its share of the files
        from keras_dl.data.tables.rows import load_row_group, open_file
        from keras_dl.storage import use_environment

        use_environment(settings)  # the object store's endpoint and credentials

        for batch in batches:
            for index in batch.column(0).to_pylist():
                pf = open_file(snapshot, index)
                for rg in range(pf.num_row_groups):
                    yield from load_row_group(snapshot, index, pf, rg, names).to_batches()

    count = len(snapshot.files)
    tasks = max(1, min(count, default_parallelism(spark) * 2))
    files = spark.createDataFrame([(i,) for i in range(count)], "file int").repartition(tasks)
    return files.mapInArrow(read_files, from_arrow_schema(snapshot.schema)), snapshot


def write_predictions(scored, to: str, mode: str = "error"):
    """Write a scored DataFrame as a Delta table: the executors write, the driver commits."""
    from keras_dl.data.ingest.spark_delta import write_delta

    return write_delta(scored, to, mode=mode)
