"""Spark DataFrames to the data path, in the spirit of Petastorm's ``make_spark_converter``.

A DataFrame is materialized once to a Parquet cache folder, then read like any Parquet table.
The same DataFrame (the same query plan) asked for again in the process reuses its folder
instead of writing it twice. It is repartitioned so every worker gets at least 2 partitions
(row groups), since too few leave GPUs idle. ``delete()`` removes the folder; the converter is
a context manager that does so on exit::

    with make_spark_converter(df, cache_dir="/dbfs/tmp/keras_dl") as conv:
        exp = resolve(RECIPE.defaults, sets=[f"data.table={conv.path}"])
        fit(exp)
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any

from keras_dl.errors import DataError

log = logging.getLogger(__name__)
_lock = threading.Lock()
_cache: dict[tuple, SparkConverter] = {}  # (semantic hash, schema) -> live converter


class SparkConverter:
    """One materialized DataFrame: its Parquet folder, row count and the table snapshot.

    Made by :func:`make_spark_converter`; do not build it directly.
    """

    def __init__(self, key: tuple, plan: Any, path: str, rows: int, partitions: int):
        self._key, self._plan = key, plan
        self.path, self.rows, self.partitions = path, rows, partitions
        self.deleted = False

    def open(self):
        """The :class:`~keras_dl.data.snapshot.TableSnapshot` of the materialized rows."""
        from keras_dl.data.tables import open_table

        if self.deleted:
            raise DataError(f"The Spark converter at {self.path!r} was deleted; convert again.")
        return open_table(self.path)

    def delete(self) -> None:
        """Remove the Parquet folder (idempotent); later conversions will write it again."""
        with _lock:
            if _cache.get(self._key) is self:
                del _cache[self._key]
        if not self.deleted:
            self.deleted = True
            _remove(self.path)

    def __enter__(self) -> SparkConverter:
        return self

    def __exit__(self, *exc) -> None:
        self.delete()

    def __repr__(self) -> str:
        return f"SparkConverter(path={self.path!r}, rows={self.rows}, partitions={self.partitions})"


def make_spark_converter(
    df,
    cache_dir: str | None = None,
    *,
    workers: int | None = None,
    dtype: str | None = "float32",
) -> SparkConverter:
    """Materialize ``df`` as Parquet once (per query plan) and return its converter.

    Args:
        df: A ``pyspark.sql.DataFrame``. Numeric, boolean, string, binary and (nested) array
            columns are accepted; vectors, structs and maps are refused with a fix.
        cache_dir: Parent folder of the cached Parquet folders (local or a URI Spark and
            pyarrow can both reach). Defaults to the Spark conf ``keras_dl.cache_dir``, else
            a temp folder.
        workers: Readers (ranks) that will share the data; there are at least 2 partitions per
            worker. Defaults to Spark's default parallelism.
        dtype: Cast double columns (and arrays of double) to this type: "float32" halves the
            data and matches Keras' default; None keeps them. Defaults to "float32".

    Raises:
        DataError: For a column type the data path cannot turn into a tensor.
    """
    spark = df.sparkSession
    check_columns(df)
    df = _cast_doubles(df, dtype)
    key = (df.semanticHash(), df.schema.json(), workers)
    plan = df._jdf.queryExecution().analyzed()
    with _lock:
        hit = _cache.get(key)
        if hit is not None and not hit.deleted and hit._plan.sameResult(plan):
            log.info("Reusing the Parquet cache of this DataFrame at %s", hit.path)
            return hit
    workers = workers or spark.sparkContext.defaultParallelism
    partitions = df.rdd.getNumPartitions()
    if partitions < 2 * workers:
        # Each partition is one Parquet file with one row group: a unit of sharding.
        df = df.repartition(2 * workers)
        partitions = 2 * workers
    root = cache_dir or spark.conf.get("keras_dl.cache_dir", None) or _default_dir()
    path = f"{root.rstrip('/')}/{key[0] & 0xFFFFFFFF:08x}-{uuid.uuid4().hex[:12]}"
    df.write.mode("error").parquet(path)
    rows = spark.read.parquet(path).count()
    converter = SparkConverter(key, plan, path, rows, partitions)
    with _lock:
        _cache[key] = converter
    atexit.register(converter.delete)
    log.info("Materialized a DataFrame of %d rows to %s (%d files)", rows, path, partitions)
    return converter


def check_columns(df) -> None:
    """Refuse vector, struct and map columns by name, saying how to convert each.

    Raises:
        DataError: Naming every such column.
    """
    from pyspark.sql import types as T

    problems = []
    for f in df.schema.fields:
        t = f.dataType
        while isinstance(t, T.ArrayType):
            t = t.elementType
        if isinstance(t, T.UserDefinedType) and type(t).__name__ == "VectorUDT":  # ml or mllib
            problems.append(
                f"{f.name!r} is a vector: convert it with "
                f"pyspark.ml.functions.vector_to_array(col({f.name!r}))"
            )
        elif isinstance(t, T.UserDefinedType):
            problems.append(f"{f.name!r} is a user-defined type {t.simpleString()}: cast it")
        elif isinstance(t, T.StructType):
            problems.append(
                f"{f.name!r} is a struct: select its fields as columns "
                f"(col('{f.name}.<field>')) or pack them into an array"
            )
        elif isinstance(t, T.MapType):
            problems.append(f"{f.name!r} is a map: turn its keys into columns")
    if problems:
        raise DataError(
            "The Spark DataFrame has columns that cannot become tensors: "
            + "; ".join(problems)
            + ". Convert or drop them before training."
        )


def _cast_doubles(df, dtype: str | None):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if dtype is None:
        return df
    if dtype != "float32":
        raise DataError(f"dtype={dtype!r}: only 'float32' or None are supported.")
    cols = []
    for f in df.schema.fields:
        t, depth = f.dataType, 0
        while isinstance(t, T.ArrayType):
            t, depth = t.elementType, depth + 1
        if isinstance(t, T.DoubleType):
            target: T.DataType = T.FloatType()
            for _ in range(depth):
                target = T.ArrayType(target)
            cols.append(F.col(f.name).cast(target).alias(f.name))
        else:
            cols.append(F.col(f.name))
    return df.select(*cols)


def _default_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "keras_dl_spark_cache")


def _remove(path: str) -> None:
    try:
        if "://" in path and not path.startswith("file://"):
            import pyarrow.fs as pafs

            fs, p = pafs.FileSystem.from_uri(path)
            fs.delete_dir(p)
        else:
            shutil.rmtree(path.removeprefix("file://"), ignore_errors=True)
    except Exception as exc:  # cleanup must not mask the caller's own error
        log.warning("Could not delete the Spark cache %s: %s", path, exc)
