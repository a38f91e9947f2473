"""Tables in and out of Spark for batch inference, without Delta's Spark jars.

Spark reads the Parquet files of one table version directly (the file list comes from
``keras_dl.data.tables.open_table``, so Delta time travel works), and the predictions are
written with ``deltalake``. On a Spark that has Delta, read with ``spark.read.format("delta")``
and write ``keras_dl.inference.predict``'s DataFrame with ``df.write.format("delta")`` instead.
"""

from __future__ import annotations

import os
import sys

from keras_dl.errors import DataError


def spark_session(
    master: str = "local[*]",
    app_name: str = "keras-dl",
    *,
    bind_address: str = "127.0.0.1",
    ui: bool = False,
):
    """A Spark session with Arrow on and executors on this Python interpreter.

    Args:
        master: Spark master URL. Defaults to "local[*]".
        app_name: Application name. Defaults to "keras-dl".
        bind_address: Where the driver listens on a local master (``runtime.bind_address``).
            Defaults to "127.0.0.1".
        ui: Start Spark's web UI (``runtime.spark_ui``). Defaults to False.
    """
    # Workers must run the interpreter that has keras_dl, TensorFlow and MLflow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from keras_dl.distribute.loopback import spark_conf

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

    Returns:
        The DataFrame and the table's snapshot (for its URI and version).
    """
    from keras_dl.data.tables import open_table

    snapshot = open_table(table, version)
    if not snapshot.files:
        raise DataError(f"Table {snapshot.uri!r} (version {snapshot.version}) has no data files.")
    reader = spark.read
    if snapshot.partition_columns and os.path.isdir(snapshot.uri):
        # Partition values live in the folder names (hive style); basePath makes them columns.
        reader = reader.option("basePath", snapshot.uri)
    return reader.parquet(*snapshot.files), snapshot


def write_predictions(scored, to: str, mode: str = "error"):
    """Collect a scored DataFrame through Arrow and write it as a Delta table."""
    import pyarrow as pa

    from keras_dl.data.ingest import write_table

    frame = scored.toPandas()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    return write_table(table, to, mode=mode, rows_per_group=max(1, min(len(frame), 65536)))
