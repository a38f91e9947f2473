"""One Spark API for both kinds of session: classic (py4j, a SparkContext) and Spark Connect.

A Spark Connect session (Databricks shared and serverless clusters, ``SparkSession.builder
.remote(...)``, ``spark.api.mode=connect``) has no ``sparkContext``, no ``_jsc`` and no ``rdd``:
each raises ``JVM_ATTRIBUTE_NOT_SUPPORTED`` or ``NOT_IMPLEMENTED``. keras_dl goes through these
helpers instead, so every entry point behaves alike on both:

- :func:`ship_file` / :func:`ship_folder`: a file or a folder to every executor, found there
  with ``pyspark.SparkFiles.get(name)`` (``addFile`` / ``addArchive`` on classic,
  ``addArtifacts(file=True)`` / ``addArtifacts(archive=True)`` on Connect, where artifacts belong
  to the client's session);
- :func:`default_parallelism` and :func:`partition_count`: without ``sparkContext`` or ``rdd``;
- :func:`refuse`: a :class:`~keras_dl.errors.SparkConnectError` that names the feature and what
  to do instead, where a Connect session truly cannot do something.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from keras_dl.errors import SparkConnectError

_parallelism: dict[str, int] = {}  # Connect session id -> its default parallelism


def is_connect(spark) -> bool:
    """Whether ``spark`` (a SparkSession) talks to Spark over Spark Connect."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def ship_file(spark, path: str) -> str:
    """Send one local file to every executor of ``spark``'s session; return its name there.

    The executors find it with ``pyspark.SparkFiles.get(name)``.
    """
    if is_connect(spark):
        spark.addArtifacts(path, file=True)
    else:
        spark.sparkContext.addFile(path)
    return os.path.basename(path)


def ship_folder(spark, folder: str) -> str:
    """Send a local folder to every executor as one zip archive; return its name there.

    ``pyspark.SparkFiles.get(name)`` on an executor is a folder holding ``folder``'s contents
    (Spark unpacks the archive once per executor). One path for both kinds of session: Spark
    Connect ships files, not folders, and ``addArchive`` is the classic twin of an archive
    artifact.
    """
    name = f"{os.path.basename(folder.rstrip(os.sep))}-{uuid.uuid4().hex[:8]}"
    archive = shutil.make_archive(os.path.join(tempfile.mkdtemp(), name), "zip", folder)
    if is_connect(spark):
        spark.addArtifacts(archive, archive=True)
    else:
        spark.sparkContext.addArchive(archive)
    return os.path.basename(archive)


def default_parallelism(spark) -> int:
    """``sparkContext.defaultParallelism``, also on Spark Connect.

    Connect has no SparkContext: the count is the partitions of ``spark.range`` without a
    partition count, which Spark sizes by the same default (one tiny job, once per session).
    """
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    key = spark.session_id
    if key not in _parallelism:
        from pyspark.sql import functions as F

        # spark_partition_id is non-deterministic: Spark takes it in a projection, not an aggregate.
        ids = spark.range(1 << 16).select(F.spark_partition_id().alias("p"))
        row = ids.agg(F.max("p").alias("p")).first()
        _parallelism[key] = int(row["p"]) + 1
    return _parallelism[key]


def partition_count(df) -> int:
    """``df.rdd.getNumPartitions()``, also on Spark Connect.

    Connect has no RDD: there the count is of the non-empty partitions, by one pass over ``df``
    that reads no column.
    """
    if not is_connect(df.sparkSession):
        return df.rdd.getNumPartitions()
    from pyspark.sql import functions as F

    return int(df.select(F.spark_partition_id().alias("p")).distinct().count())


def refuse(feature: str, instead: str) -> SparkConnectError:
    """The error for ``feature``, which a Spark Connect session cannot give; raise it.

    Args:
        feature: What was asked, as the user wrote it.
        instead: What to do on Connect, or how to get a classic session.
    """
    return SparkConnectError(
        f"{feature} is not available on a Spark Connect session (it needs the JVM's "
        f"SparkContext, which Connect clients do not have). {instead}"
    )
