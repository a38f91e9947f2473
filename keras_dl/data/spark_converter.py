"""Spark DataFrames to the data path, in the spirit of Petastorm's ``make_spark_converter``.

A DataFrame is materialized once to a Parquet cache folder, then read like any Parquet table.
The same DataFrame (the same query plan) asked for again in the process reuses its folder
instead of writing it twice. It is repartitioned so every worker gets at least 2 partitions
(row groups), since too few leave GPUs idle. ``delete()`` removes the folder; the converter is
a context manager that does so on exit::

    with make_spark_converter(df, cache_dir="/dbfs/tmp/keras_dl") as conv:
        exp = resolve(RECIPE.defaults, sets=[f"data.table={conv.path}"])
        fit(exp)

With ``persistent=True`` the folder is a Delta table named by a fingerprint of the rows (their
content, not the query plan: a plan names RDDs and temp views that another process does not
have), so the same rows map to the same table from any process, a complete table already there
is reused, and nothing is deleted at exit. That is what a store that outlives the process needs:
``keras_dl.spark.KerasEstimator`` resumes a run from a new process on the same table.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any

from keras_dl.connect import default_parallelism, is_connect, partition_count
from keras_dl.errors import DataError

log = logging.getLogger(__name__)
_lock = threading.Lock()
_cache: dict[tuple, SparkConverter] = {}  # (semantic hash, schema, ...) -> live converter
# parquet-mr's page checksums (Spark passes writer options into the Hadoop configuration).
CHECKSUMS = "parquet.page.write-checksum.enabled"
_FIRST_COMMIT = "00000000000000000000.json"  # a Delta table's version 0: its write completed


class SparkConverter:
    """One materialized DataFrame: its Parquet folder, row count and the table snapshot.

    Made by :func:`make_spark_converter`; do not build it directly.
    """

    def __init__(self, key: tuple, plan: Any, path: str, rows: int, partitions: int):
        self._key, self._plan = key, plan
        self.path, self.rows, self.partitions = path, rows, partitions
        self.deleted = False

    def open(self):
        """The :class:`~keras_dl.data.tables.snapshot.TableSnapshot` of the materialized rows."""
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
    table_format: str = "parquet",
    persistent: bool = False,
) -> SparkConverter:
    """Materialize ``df`` as Parquet once (per query plan) and return its converter.

    Args:
        df: A ``pyspark.sql.DataFrame``. Numeric, boolean, string, binary and (nested) array
            columns are accepted; vectors, structs and maps are refused with a fix.
        cache_dir: Parent folder of the cached folders: local, or a URI that Spark and
            pyarrow can both reach (for "parquet"; for "delta", ``keras_dl.storage`` is enough). Defaults to the Spark conf ``keras_dl.cache_dir``, else
            a temp folder.
        workers: Readers (ranks) that will share the data; there are at least 2 partitions per
            worker. Defaults to Spark's default parallelism.
        dtype: Cast double columns (and arrays of double) to this type: "float32" halves the
            data and matches Keras' default; None keeps them. Defaults to "float32".
        table_format: "parquet" (written by Spark), or "delta": written by the executors and
            committed as version 0 of a Delta table through :func:`keras_dl.data.ingest.spark_delta.write_delta`
            (Spark here has no Delta jars), so the runs trained on it record a table and a
            version, and ``cache_dir`` may be an object-store URI (``s3://...``, see
            :mod:`keras_dl.storage`). Defaults to "parquet".
        persistent: Name the folder ``<cache_dir>/<fingerprint>`` after the rows' content (one
            more pass over ``df``), reuse a complete table already there, from this process or
            an earlier one, and keep it at exit (``delete()`` still removes it). Needs
            ``table_format="delta"``. Defaults to False: a new folder per process, deleted at
            exit.

    Raises:
        DataError: For a column type the data path cannot turn into a tensor, an unknown
            ``table_format``, or ``persistent`` without Delta.
    """
    spark = df.sparkSession
    if table_format not in ("parquet", "delta"):
        raise DataError(f"table_format={table_format!r}: use 'parquet' or 'delta'.")
    if persistent and table_format != "delta":
        raise DataError(
            "persistent=True needs table_format='delta': only a Delta commit tells a later "
            "process that the folder was written completely."
        )
    check_columns(df)
    df = _cast_doubles(df, dtype)
    root = (cache_dir or spark.conf.get("keras_dl.cache_dir", None) or _default_dir()).rstrip("/")
    key = (df.semanticHash(), df.schema.json(), workers, table_format, root, persistent)
    # The analyzed plan guards the semantic hash against a collision; a Spark Connect client
    # has no JVM plan to compare, so there the hash and the schema decide alone.
    plan = None if is_connect(spark) else df._jdf.queryExecution().analyzed()
    with _lock:
        hit = _cache.get(key)
        if hit is not None and not hit.deleted and (plan is None or hit._plan.sameResult(plan)):
            # A persistent table outlives this process's bookkeeping: someone may have removed it.
            if not persistent or _is_committed(hit.path):
                log.info("Reusing the materialized copy of this DataFrame at %s", hit.path)
                return hit
    workers = workers or default_parallelism(spark)
    if persistent:
        fingerprint, rows = _fingerprint(df, workers)
        path = f"{root}/{fingerprint}"
        if _is_committed(path):
            log.info("Reusing the Delta table of these rows at %s (written earlier)", path)
            converter = SparkConverter(key, plan, path, rows, 0)
            converter.partitions = len(converter.open().files)
            return _remember(converter, persistent)
    else:
        path = f"{root}/{key[0] & 0xFFFFFFFF:08x}-{uuid.uuid4().hex[:12]}"
    partitions = partition_count(df)
    if partitions < 2 * workers:
        # Each partition is one Parquet file with one row group: a unit of sharding.
        df = df.repartition(2 * workers)
        partitions = 2 * workers
    if table_format == "delta":
        from keras_dl.data.ingest.spark_delta import write_delta

        report = write_delta(df, path, mode="error")
        rows, partitions = report.rows, report.files
        if not rows:
            _remove(path)
            raise DataError("The Spark DataFrame has no rows: there is nothing to materialize.")
    else:
        df.write.mode("error").option(CHECKSUMS, "true").parquet(path)
        rows = spark.read.parquet(path).count()
    converter = _remember(SparkConverter(key, plan, path, rows, partitions), persistent)
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


def _fingerprint(df, workers: int) -> tuple[str, int]:
    """A name for ``df``'s rows that any process computes alike, and their count.

    One aggregation pass: per row a 64-bit xxhash of every column, combined by count, sum and
    xor (so the row order and partitioning do not matter), with the schema and the number of
    workers the files are laid out for.
    """
    cols = ", ".join(f"`{name.replace('`', '``')}`" for name in df.columns)
    stats = (
        df.selectExpr(f"xxhash64({cols}) AS h")
        .selectExpr(
            "count(1) AS n",
            "coalesce(sum(h & 4294967295), 0) AS lo",  # 32-bit halves: the sums cannot overflow
            "coalesce(sum(shiftrightunsigned(h, 32)), 0) AS hi",
            "coalesce(bit_xor(h), 0) AS x",
        )
        .first()
    )
    if not stats["n"]:
        raise DataError("The Spark DataFrame has no rows: there is nothing to materialize.")
    text = json.dumps([df.schema.json(), stats["n"], stats["lo"], stats["hi"], stats["x"], workers])
    return hashlib.sha256(text.encode()).hexdigest()[:20], int(stats["n"])


def _is_committed(path: str) -> bool:
    from keras_dl.storage import open_storage

    return any(name == _FIRST_COMMIT for name, _ in open_storage(path).list("_delta_log"))


def _remember(converter: SparkConverter, persistent: bool) -> SparkConverter:
    with _lock:
        _cache[converter._key] = converter
    if not persistent:
        atexit.register(converter.delete)
    return converter


def _default_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "keras_dl_spark_cache")


def _remove(path: str) -> None:
    try:
        if "://" in path and not path.startswith("file://"):
            from keras_dl.storage import filesystem

            fs, p = filesystem(path)  # the endpoint and credentials of keras_dl.storage
            fs.delete_dir(p)
        else:
            shutil.rmtree(path.removeprefix("file://"), ignore_errors=True)
    except Exception as exc:  # cleanup must not mask the caller's own error
        log.warning("Could not delete the Spark cache %s: %s", path, exc)
