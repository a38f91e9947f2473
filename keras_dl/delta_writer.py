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
)

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

    if mode not in MODES:
        raise DataError(f"Write mode {mode!r} is not one of {', '.join(MODES)}.")
    check_safe_delta_writes(to)
    options = delta_storage_options(to)
    exists = any(name.endswith(".json") for name, _ in open_storage(to).list("_delta_log"))
    if exists and mode == "error":
        raise DataError(
            f"Delta table {to!r} already exists. Pass --mode overwrite (a new version) or "
            "--mode append, or choose another --out."
        )
    schema = to_arrow_schema(df.schema)
    manifest = df.mapInArrow(
        _file_writer(to, schema, rows_per_file), "path string, size long, rows long, mtime long"
    ).collect()  # one small row per file: the driver never holds the data
    actions = [_add_action(r) for r in manifest]
    if local_path(to) is not None:
        os.makedirs(local_path(to), exist_ok=True)
    version = _commit(to, schema, actions, mode, exists, options)
    return CommitReport(
        table=to, version=version, rows=sum(r["rows"] for r in manifest), files=len(manifest)
    )


def _file_writer(to: str, schema, rows_per_file: int):
    """The function each Spark task runs: write its batches as Parquet files under ``to``."""
    settings = environment()

    def write(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from keras_dl.storage import use_environment

        use_environment(settings)  # the object store's endpoint and credentials

        fs, root = _filesystem(to)
        writer, sink, path, rows = None, None, None, 0
        out = []

        def close():
            nonlocal writer, sink
            writer.close()
            size = sink.tell()  # object stores may not list a file's size right after a PUT
            sink.close()
            out.append((os.path.basename(path), int(size), rows))
            writer = sink = None

        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                path = f"{root}/part-{uuid.uuid4()}.parquet"
                sink = fs.open_output_stream(path)
                # Page checksums: readers verify them (keras_dl.data.rows.open_file).
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


def _commit(to: str, schema, actions, mode: str, exists: bool, options) -> int:
    """Commit ``actions`` (files already in the table's storage) as one transaction; its version."""
    from deltalake import DeltaTable, Schema
    from deltalake.transaction import create_table_with_add_actions

    write_id, props = new_write_id()
    if exists:
        table = DeltaTable(to, storage_options=options)
        table.create_write_transaction(actions, mode, schema, commit_properties=props)
    else:
        create_table_with_add_actions(
            to,
            Schema.from_arrow(schema),
            actions,
            "overwrite",
            storage_options=options,
            commit_properties=props,
        )
    return committed_version(to, write_id, options)


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
    from deltalake import DeltaTable

    table = DeltaTable(to, storage_options=options or None)
    for limit in (20, None):  # the commit is nearly always among the newest
        for entry in table.history(limit):
            if entry.get(WRITE_ID) == write_id:
                return int(entry["version"])
    raise DataError(
        f"Delta table {to!r} has no commit stamped {WRITE_ID}={write_id} although the write "
        "returned: its log was replaced meanwhile. Check the table's history before reading it."
    )


def _add_action(row):
    from deltalake.transaction import AddAction

    return AddAction(
        row["path"], row["size"], {}, row["mtime"], True, json.dumps({"numRecords": row["rows"]})
    )
