"""Plain Parquet (a folder, a glob, or a list of files) -> :class:`TableSnapshot`.

Hive-style folders (``year=2024/part-0.parquet``) give partition columns; their values are typed
as pyarrow's partition discovery types them, and ``__HIVE_DEFAULT_PARTITION__`` is a null.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from keras_dl.data.tables.filters import to_type
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError, KerasDLError
from keras_dl.storage import filesystem, local_path, open_storage
from keras_dl.storage.retry import retrying

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def open_parquet(table: str) -> TableSnapshot:
    """A Parquet folder, a local glob or a single file.

    Raises:
        DataError: When nothing matches, the folder holds no Parquet file, or a file is not
            readable Parquet.
    """
    local = local_path(table)
    if local is not None and any(c in local for c in "*?["):
        files = sorted(glob.glob(local, recursive=True))
        if not files:
            raise DataError(f"The glob {table!r} matches no file. Check the pattern.")
        return open_parquet_files(files, uri=table)
    if local is not None and not os.path.exists(local):
        raise DataError(
            f"Table {table!r} does not exist. Create it first (for example `keras-dl ingest "
            f"sklearn-digits --to {table}`) or fix data.table."
        )
    if local is not None and os.path.isfile(local):
        return open_parquet_files([local], uri=table)
    return _open_dir(table, local)


def open_parquet_files(
    files: list[str], uri: str | None = None, root: str | None = None, schema: pa.Schema = None
) -> TableSnapshot:
    """Parquet files given one by one; hive partitions are read from paths below ``root``."""
    import pyarrow.parquet as pq

    for f in files:
        lp = local_path(f)
        if lp is not None and not os.path.isfile(lp):
            raise DataError(f"Parquet file {f!r} does not exist. Fix the file list in data.table.")
    raw = [_hive_partitions(f, root) for f in files]
    part_cols = tuple(raw[0]) if raw else ()
    if schema is None:
        try:
            fs, first = filesystem(files[0])
            schema = retrying(lambda: pq.read_schema(first, filesystem=fs), files[0])
        except KerasDLError:  # the store stayed unreachable (StoreUnavailable)
            raise
        except Exception as exc:
            raise DataError(f"Parquet file {files[0]!r} cannot be read: {exc}") from None
        for col in part_cols:
            if col not in schema.names:
                schema = schema.append(pa.field(col, pa.string()))
    parts = tuple(
        {c: _typed(p.get(c), schema.field(c).type, c, f) for c in part_cols}
        for p, f in zip(raw, files)
    )
    return TableSnapshot(
        uri=uri or ",".join(files),
        format="parquet",
        version=None,
        files=tuple(os.path.abspath(f) if local_path(f) == f else f for f in files),
        partitions=parts,
        schema=schema,
        partition_columns=part_cols,
    )


def _open_dir(table: str, local: str | None) -> TableSnapshot:
    import pyarrow.dataset as ds

    storage = open_storage(table)
    root = storage.uri
    if local is None and not storage.is_dir():
        raise DataError(
            f"Table {table!r} does not exist (no object under that prefix). Write it first, "
            "or fix data.table."
        )
    try:
        dataset = ds.dataset(
            storage.root, filesystem=storage.fs, format="parquet", partitioning="hive"
        )
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"Parquet table {table!r} cannot be listed: {exc}") from None
    files = sorted(storage.file_uri(f) for f in dataset.files)
    if not files:
        raise DataError(
            f"Table {table!r} holds no Parquet file. Write data to it first, or point "
            "data.table at a Delta table or Parquet directory."
        )
    return open_parquet_files(files, uri=root, root=root, schema=dataset.schema)


def _hive_partitions(path: str, root: str | None) -> dict[str, str]:
    rel = os.path.relpath(path, root) if root and local_path(path) == path else path
    out = {}
    for seg in Path(rel).parts[:-1]:
        key, sep, value = seg.partition("=")
        if sep:
            out[key] = value
    return out


def _typed(value: str | None, kind: pa.DataType, column: str, path: str) -> Any:
    from urllib.parse import unquote

    if value is None or value == HIVE_NULL:
        return None
    try:  # Hive escapes special characters in folder names
        return to_type(unquote(value), kind, column)
    except DataError:
        raise DataError(
            f"File {path!r} has partition {column}={value!r}, which is not a {kind} value like "
            "the other files' partitions. Rename the folder or move the file."
        ) from None
