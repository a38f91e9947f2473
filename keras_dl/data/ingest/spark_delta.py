"""Write a Spark DataFrame as a Delta table: executors write the files, the driver commits once.

Spark has no Delta writer here (Delta's jars need Maven), and collecting the rows on the driver
would make its memory grow with the table. So each Spark task writes its rows as Parquet files
straight to the table's storage (local disk or an object store, through ``keras_dl.storage``)
and returns one small row per file: its path, size and row count. The driver collects only
those, and commits them as one Delta transaction through deltalake (``create_table_with_add_actions``
for a new table, ``DeltaTable.create_write_transaction`` for an existing one), the way
delta-rs' own Dask and Ray integrations commit files written elsewhere. Files of a failed job are never committed: readers
never see them. Every page the tasks write carries a CRC checksum, which keras_dl's readers
verify.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass

from keras_dl.errors import DataError
from keras_dl.storage import (
    check_safe_delta_writes,
    delta_storage_options,
    environment,
    filesystem,
    local_path,
    open_storage,
    staged_output,
)
from keras_dl.storage.retry import retrying

MODES = ("error", "append", "overwrite")


@dataclass(frozen=True)
class CommitReport:
    """What one write added: the version it committed, and its files and rows."""

    table: str
    version: int
    rows: int
    files: int


def write_delta(df, to: str, mode: str = "error", rows_per_file: int = 1 << 20) -> CommitReport:
    """Write ``df`` as a Delta table at ``to`` (a path or URI), from the executors.

    Args:
        df: The rows (a Spark DataFrame). Its schema becomes the table's.
        to: The table's path or URI.
        mode: "error" when the table exists, "append" or "overwrite". Defaults to "error".
        rows_per_file: Rows per Parquet file a task writes at most. Defaults to 1M.

    Returns:
        The committed version and the rows and files *this* write added.

    Raises:
        DataError: For a table that exists with mode "error", an unknown mode, or an S3 table
            without a commit lock.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    exists = check_writable(to, mode)
    options = delta_storage_options(to)
    schema = to_arrow_schema(df.schema)
    manifest = df.mapInArrow(
        _file_writer(to, schema, rows_per_file), "path string, size long, rows long, mtime long"
    ).collect()  # one small row per file: the driver never holds the data
    actions = [_add_action(r) for r in manifest]
    if local_path(to) is not None:
        os.makedirs(local_path(to), exist_ok=True)
    version = commit(to, schema, actions, mode, exists, options)
    return CommitReport(
        table=to, version=version, rows=sum(r["rows"] for r in manifest), files=len(manifest)
    )


def check_writable(to: str, mode: str = "error") -> bool:
    """Whether the Delta table ``to`` exists, once it is known that ``mode`` may write it.

    :func:`write_delta` calls it first; a command calls it before it starts Spark too, so that a
    table that exists fails at once, not after the scoring.

    Raises:
        DataError: For a table that exists with mode "error", an unknown mode, or an S3 table
            without a commit lock.
    """
    if mode not in MODES:
        raise DataError(f"Write mode {mode!r} is not one of {', '.join(MODES)}.")
    check_safe_delta_writes(to)
    exists = any(name.endswith(".json") for name, _ in open_storage(to).list("_delta_log"))
    if exists and mode == "error":
        raise DataError(
            f"Delta table {to!r} already exists. Pass --mode overwrite (a new version) or "
            "--mode append, or choose another --out."
        )
    return exists


def _file_writer(to: str, schema, rows_per_file: int):
    """The function each Spark task runs: write its batches as Parquet files under ``to``."""
    settings = environment()

    def write(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from keras_dl.storage import use_environment

        use_environment(settings)  # the object store's endpoint and credentials

        _filesystem(to)  # a local table's folder
        writer, sink, name, rows = None, None, None, 0
        staged = contextlib.ExitStack()
        out = []

        def close():
            nonlocal writer, sink
            writer.close()
            size = sink.tell()  # object stores may not list a file's size right after a PUT
            staged.close()  # the upload, retried through an outage
            out.append((name, int(size), rows))
            writer = sink = None

        # Named by the task's partition first, so the snapshot (files in path order) reads the
        # DataFrame's rows in its partitions' order, the same on every write of the same rows:
        # a random name alone would shuffle the files differently each time.
        from pyspark import TaskContext

        task = TaskContext.get()
        partition, files = (task.partitionId() if task is not None else 0), 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                name = f"part-{partition:05d}-{files:04d}-{uuid.uuid4()}.parquet"
                files += 1
                sink = staged.enter_context(staged_output(f"{to.rstrip('/')}/{name}"))
                # Page checksums: readers verify them (keras_dl.data.tables.rows.open_file).
                writer, rows = pq.ParquetWriter(sink, schema, write_page_checksum=True), 0
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
            rows += batch.num_rows
            if rows >= rows_per_file:
                close()
        if writer is not None:
            close()
        if out:
            now = int(time.time() * 1000)
            yield pa.RecordBatch.from_pydict(
                {
                    "path": [p for p, _, _ in out],
                    "size": [s for _, s, _ in out],
                    "rows": [n for _, _, n in out],
                    "mtime": [now] * len(out),
                }
            )

    return write


def _filesystem(to: str):
    """:func:`keras_dl.storage.filesystem`, creating a local table's folder."""
    local = local_path(to)
    if local is not None:
        os.makedirs(local, exist_ok=True)
    return filesystem(to)


def commit(to: str, schema, actions, mode: str, exists: bool, options, partition_by=()) -> int:
    """Commit ``actions`` (files already in the table's storage) as one transaction; its version.

    Args:
        to: The table's path or URI.
        schema: The table's Arrow schema, partition columns included.
        actions: deltalake ``AddAction`` per file.
        mode: "append" or "overwrite" (a new table is created whatever the mode).
        exists: Whether the table has a log already.
        options: deltalake storage options.
        partition_by: The table's partition columns. Defaults to ().
    """
    from deltalake import DeltaTable, Schema
    from deltalake.transaction import create_table_with_add_actions

    write_id, props = new_write_id()

    def attempt() -> int:
        if exists:
            table = DeltaTable(to, storage_options=options or None)
            table.create_write_transaction(
                actions, mode, schema, list(partition_by) or None, commit_properties=props
            )
        else:
            create_table_with_add_actions(
                to,
                Schema.from_arrow(schema),
                actions,
                "overwrite",
                list(partition_by) or None,
                storage_options=options or None,
                commit_properties=props,
            )
        return committed_version(to, write_id, options)

    # A commit that failed transiently may have landed (its reply was lost): it is looked for
    # in the log, by its write id, before the commit is tried again, so it is never made twice.
    return retrying(attempt, to, landed=lambda: find_commit(to, write_id, options))


# The commitInfo key a keras_dl write stamps its commit with, to find the version it committed.
WRITE_ID = "keras_dl.write_id"


def new_write_id():
    """A fresh write id, and the deltalake ``CommitProperties`` that stamp a commit with it."""
    from deltalake import CommitProperties

    write_id = uuid.uuid4().hex
    return write_id, CommitProperties(custom_metadata={WRITE_ID: write_id})


def committed_version(to: str, write_id: str, options: dict | None = None) -> int:
    """The version of the commit stamped ``write_id`` (see :func:`new_write_id`).

    deltalake's writers return nothing, and the table's latest version may already hold
    another writer's commit (or the commit retried past one that came first), so the version is
    read from the commit itself, searching the log newest first.

    Raises:
        DataError: When no commit carries ``write_id`` (the log was rewritten meanwhile).
    """
    version = retrying(lambda: find_commit(to, write_id, options), to)
    if version is not None:
        return version
    raise DataError(
        f"Delta table {to!r} has no commit stamped {WRITE_ID}={write_id} although the write "
        "returned: its log was replaced meanwhile. Check the table's history before reading it."
    )


def find_commit(to: str, write_id: str, options: dict | None = None) -> int | None:
    """The version of the commit stamped ``write_id``, or None (no such commit, or no table)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(to, storage_options=options or None)
    except TableNotFoundError:
        return None
    for limit in (20, None):  # the commit is nearly always among the newest
        for entry in table.history(limit):
            if entry.get(WRITE_ID) == write_id:
                return int(entry["version"])
    return None


def _add_action(row):
    from deltalake.transaction import AddAction

    return AddAction(
        row["path"], row["size"], {}, row["mtime"], True, json.dumps({"numRecords": row["rows"]})
    )


def file_stats(metadata) -> str:
    """A file's Delta ``stats`` JSON from its Parquet footer (``pyarrow.parquet.FileMetaData``).

    ``numRecords``, and ``minValues``/``maxValues``/``nullCount`` per column that is not in a
    list or map (struct fields nested as Delta nests them), merged over the row groups, so
    readers can skip files. A bound is left out where it cannot be exact: binary columns,
    non-finite floats, decimals a double cannot carry.
    """
    merged: dict[tuple[str, ...], list] = {}  # column path -> [min, max, nulls]
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            stats = column.statistics
            path = tuple(column.path_in_schema.split("."))
            if metadata.schema.column(c).max_repetition_level > 0:
                continue  # inside a list or map: Delta keeps no statistics for it
            entry = merged.setdefault(path, [None, None, 0])
            if stats is None or not stats.has_null_count:
                entry[2] = None
            elif entry[2] is not None:
                entry[2] += stats.null_count
            if entry[0] is _NO_BOUND:
                continue
            bounds = _bounds(metadata.schema.column(c), stats)
            if bounds is None:
                if stats is None or stats.has_min_max or group.num_rows > stats.null_count:
                    entry[0] = entry[1] = _NO_BOUND  # a group without bounds: none for the file
                continue
            lo, hi = bounds
            entry[0] = lo if entry[0] is None else min(entry[0], lo)
            entry[1] = hi if entry[1] is None else max(entry[1], hi)
    out = {"numRecords": metadata.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for path, (lo, hi, nulls) in merged.items():
        for key, value in (("minValues", lo), ("maxValues", hi), ("nullCount", nulls)):
            if value is not None and value is not _NO_BOUND:
                node = out[key]
                for name in path[:-1]:
                    node = node.setdefault(name, {})
                node[path[-1]] = _json_value(value)
    return json.dumps(out, separators=(",", ":"))


_NO_BOUND = object()


def _bounds(column, stats):
    """``(min, max)`` of a column chunk's statistics as Python values, or None if not exact."""
    import math
    from decimal import Decimal

    if stats is None or not stats.has_min_max:
        return None
    logical = str(column.logical_type.type)
    if column.physical_type in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY") and logical != "STRING":
        if logical != "DECIMAL":
            return None  # binary: no bounds, as delta-rs
    lo, hi = stats.min, stats.max
    if isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if isinstance(lo, Decimal) and column.precision > 15:
        return None  # a JSON number goes through a double
    if logical == "TIMESTAMP":
        utc = json.loads(column.logical_type.to_json())["isAdjustedToUTC"]
        return (lo, utc), (hi, utc)
    return lo, hi


def _json_value(value):
    """A statistic as Delta writes it in JSON (timestamps as delta-rs writes them)."""
    import datetime
    from decimal import Decimal

    if isinstance(value, tuple):  # (timestamp, adjusted to UTC)
        stamp, utc = value
        text = stamp.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        return text.replace(" ", "T") + "Z" if utc else text
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    return value
