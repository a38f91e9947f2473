"""Resolve a table reference (Delta or Parquet) to a snapshot: its files, schema and lineage.

A snapshot is the first step of the data path. It fixes *which* files a run reads, so every rank
and every epoch read the same version of the table, and it carries the lineage (URI and version)
that the run records.

Example:
    >>> snap = open_table("data/digits", version=0)          # doctest: +SKIP
    >>> train = select(snap, [("split", "=", "train")])      # doctest: +SKIP
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from keras_dl.data.filters import to_type
from keras_dl.data.petastorm_dataset import is_petastorm_dataset, open_petastorm
from keras_dl.errors import DataError

Filter = tuple[str, str, Any]
_OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")


@dataclass(frozen=True)
class TableSnapshot:
    """The files of one version of a table, with the schema they share.

    Attributes:
        uri: The table as given (absolute for local paths).
        format: "delta", "parquet" or "petastorm" (a Unischema dataset, read with make_reader).
        version: The Delta version read, or None for plain Parquet.
        files: Absolute paths or URIs of the data files.
        partitions: Partition values of each file, ``{column: value-as-string}``.
        schema: Arrow schema of the rows, partition columns included.
        partition_columns: Columns whose value comes from the file's partition, not its content.
        row_filters: Filters on non-partition columns, applied to every batch as it is read.
    """

    uri: str
    format: str
    version: int | None
    files: tuple[str, ...]
    partitions: tuple[dict[str, str], ...]
    schema: pa.Schema
    partition_columns: tuple[str, ...] = ()
    row_filters: tuple[Filter, ...] = ()
    unischema: Any = None  # Petastorm datasets only: their Unischema (codecs, shapes)

    @property
    def lineage(self) -> dict[str, str]:
        """Tags recording what was read: ``data.table`` and ``data.version``."""
        return {
            "data.table": self.uri,
            "data.version": "" if self.version is None else str(self.version),
            "data.format": self.format,
        }


def open_table(
    table: str | Sequence[str], version: int | None = None, timestamp: str | None = None
) -> TableSnapshot:
    """Open a Delta table (at its latest version, ``version`` or ``timestamp``) or Parquet files.

    Args:
        table: A Delta table path or URI; a Parquet directory; a glob; or a list (or
            comma-separated string) of Parquet files.
        version: Delta version to read. Defaults to the latest.
        timestamp: ISO 8601 timestamp for Delta time travel. Defaults to None.

    Raises:
        DataError: When the path does not exist, the version does not exist, or there is no
            Parquet file to read.
    """
    if isinstance(table, str) and "," in table:
        table = [t.strip() for t in table.split(",") if t.strip()]
    if not isinstance(table, str):
        return _open_parquet_files(list(table))
    if _is_local(table) and is_petastorm_dataset(_local_path(table) or table):
        return open_petastorm(table)
    if _is_delta(table):
        return _open_delta(table, version, timestamp)
    if version is not None or timestamp:
        raise DataError(
            f"data.version/data.timestamp was given but {table!r} is not a Delta table (no "
            "_delta_log folder). Time travel needs Delta; drop the version for plain Parquet."
        )
    if _is_local(table) and any(c in table for c in "*?["):
        files = sorted(glob.glob(table, recursive=True))
        if not files:
            raise DataError(f"The glob {table!r} matches no file. Check the pattern.")
        return _open_parquet_files(files, uri=table)
    local = _local_path(table)
    if local is not None and not os.path.exists(local):
        raise DataError(
            f"Table {table!r} does not exist. Create it first (for example `keras-dl ingest "
            f"sklearn-digits --to {table}`) or fix data.table."
        )
    if local is not None and os.path.isfile(local):
        return _open_parquet_files([table], uri=table)
    return _open_parquet_dir(table)


def select(snapshot: TableSnapshot, filters: Sequence[Filter]) -> TableSnapshot:
    """Keep the rows matching every ``(column, op, value)`` filter.

    Filters on partition columns drop whole files here; the others are kept on the snapshot and
    applied, vectorized, to each batch as it is read.
    """
    files, parts, row_filters = list(snapshot.files), list(snapshot.partitions), []
    for col, op, value in filters:
        if col not in snapshot.schema.names:
            raise DataError(
                f"Filter column {col!r} is not in table {snapshot.uri!r}. Its columns are: "
                f"{', '.join(snapshot.schema.names)}."
            )
        if op not in _OPS:
            raise DataError(f"Filter operator {op!r} on {col!r} is not one of {', '.join(_OPS)}.")
        if col in snapshot.partition_columns:
            # Partition values are path strings: compare them as the column's type.
            kind = snapshot.schema.field(col).type
            typed = _typed(value, kind, col)
            keep = [_match(to_type(p.get(col), kind, col), op, typed) for p in parts]
            files = [f for f, k in zip(files, keep) if k]
            parts = [p for p, k in zip(parts, keep) if k]
        else:
            row_filters.append((col, op, value))
    return replace(
        snapshot,
        files=tuple(files),
        partitions=tuple(parts),
        row_filters=snapshot.row_filters + tuple(row_filters),
    )


def file_url(path: str) -> str:
    """A URL Petastorm accepts for a local path or remote URI."""
    # Not Path.as_uri(): it percent-encodes "=" in partition folders, which Petastorm keeps.
    return path if "://" in path else "file://" + os.path.abspath(path)


def match_mask(values, op: str, value: Any):
    """Vectorized boolean mask of ``values <op> value`` (numpy arrays)."""
    import numpy as np

    values = np.asarray(values)
    if op in ("=", "=="):
        return values == value
    if op == "!=":
        return values != value
    if op == "<":
        return values < value
    if op == "<=":
        return values <= value
    if op == ">":
        return values > value
    if op == ">=":
        return values >= value
    if op == "in":
        return np.isin(values, list(value))
    return ~np.isin(values, list(value))


def _match(actual: Any, op: str, value: Any) -> bool:
    if actual is None:
        return op in ("!=", "not in")
    return bool(match_mask([actual], op, value)[0])


def _typed(value: Any, kind: pa.DataType, col: str) -> Any:
    if isinstance(value, (list, tuple, set)):
        return [to_type(v, kind, col) for v in value]
    return to_type(value, kind, col)


def _is_local(table: str) -> bool:
    return "://" not in table or table.startswith("file://")


def _local_path(table: str) -> str | None:
    if table.startswith("file://"):
        return table[len("file://") :]
    return None if "://" in table else table


def _is_delta(table: str) -> bool:
    local = _local_path(table)
    if local is not None:
        return os.path.isdir(os.path.join(local, "_delta_log"))
    try:  # remote: let deltalake look for the log
        from deltalake import DeltaTable

        DeltaTable(table)
        return True
    except Exception:
        return False


def _open_delta(table: str, version: int | None, timestamp: str | None) -> TableSnapshot:
    from deltalake import DeltaTable

    uri = os.path.abspath(_local_path(table)) if _local_path(table) is not None else table
    try:
        dt = DeltaTable(uri)
    except Exception as exc:
        raise DataError(f"Delta table {table!r} cannot be opened: {exc}") from None
    latest = dt.version()
    if version is not None:
        if not 0 <= version <= latest:
            raise DataError(
                f"Delta table {table!r} has no version {version}: its versions run from 0 to "
                f"{latest} (or fewer, after VACUUM). Set data.version to one of them or drop it "
                "to read the latest."
            )
        try:
            dt.load_as_version(version)
        except Exception as exc:
            raise DataError(
                f"Delta table {table!r} cannot load version {version} ({exc}). The latest is "
                f"{latest}; older versions may have been removed by VACUUM or log cleanup."
            ) from None
    elif timestamp:
        try:
            when = datetime.fromisoformat(timestamp)
            if when.tzinfo is None:  # a naive time is read as UTC, as Delta's commit times are
                when = when.replace(tzinfo=timezone.utc)
            dt.load_as_version(when)
        except ValueError:
            raise DataError(
                f"data.timestamp={timestamp!r} is not an ISO 8601 timestamp "
                "(for example 2026-11-21T10:00:00+00:00)."
            ) from None
        except Exception as exc:
            raise DataError(
                f"Delta table {table!r} has no version at or before {timestamp}: {exc}"
            ) from None
        # deltalake falls back to version 0 for a time before the table existed: refuse that.
        # From the latest table: deltalake 1.x numbers a time-travelled table's history from
        # its loaded version down, so version 0 there carried the newest commit's time.
        committed = {h.get("version"): h.get("timestamp") for h in DeltaTable(uri).history()}
        first = committed.get(dt.version())
        if first is not None and when.timestamp() * 1000 < first:
            raise DataError(
                f"Delta table {table!r} has no version at or before {timestamp}: its version "
                f"{dt.version()} was committed at "
                f"{datetime.fromtimestamp(first / 1000, timezone.utc).isoformat()}. Use a later "
                "data.timestamp or a data.version."
            )
    partition_columns = tuple(dt.metadata().partition_columns)
    # deltalake 1.x answers with arro3 objects (Arrow PyCapsule interface): pyarrow takes them.
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    paths = actions.get("path", [])
    root = dt.table_uri.rstrip("/")
    files, parts = [], []
    for i, rel in enumerate(paths):
        files.append(rel if "://" in rel or rel.startswith("/") else f"{root}/{rel}")
        parts.append(
            {
                c: (
                    ""
                    if actions[f"partition.{c}"][i] is None
                    else str(actions[f"partition.{c}"][i])
                )
                for c in partition_columns
                if f"partition.{c}" in actions
            }
        )
    files = [f[len("file://") :] if f.startswith("file://") else f for f in files]
    return TableSnapshot(
        uri=uri,
        format="delta",
        version=dt.version(),
        files=tuple(files),
        partitions=tuple(parts),
        schema=pa.schema(dt.schema().to_arrow()),
        partition_columns=partition_columns,
    )


def _open_parquet_dir(table: str) -> TableSnapshot:
    import pyarrow.dataset as ds

    local = _local_path(table)
    root = os.path.abspath(local) if local is not None else table
    try:
        dataset = ds.dataset(root, format="parquet", partitioning="hive")
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"Parquet table {table!r} cannot be listed: {exc}") from None
    files = sorted(dataset.files)
    if not files:
        raise DataError(
            f"Table {table!r} holds no Parquet file. Write data to it first, or point "
            "data.table at a Delta table or Parquet directory."
        )
    return _open_parquet_files(files, uri=root, root=root, schema=dataset.schema)


def _open_parquet_files(
    files: list[str], uri: str | None = None, root: str | None = None, schema: pa.Schema = None
) -> TableSnapshot:
    for f in files:
        lp = _local_path(f)
        if lp is not None and not os.path.isfile(lp):
            raise DataError(f"Parquet file {f!r} does not exist. Fix the file list in data.table.")
    parts = [_hive_partitions(f, root) for f in files]
    part_cols = tuple(parts[0]) if parts else ()
    if schema is None:
        try:
            schema = pq.read_schema(files[0])
        except Exception as exc:
            raise DataError(f"Parquet file {files[0]!r} cannot be read: {exc}") from None
        for col in part_cols:
            if col not in schema.names:
                schema = schema.append(pa.field(col, pa.string()))
    return TableSnapshot(
        uri=uri or ",".join(files),
        format="parquet",
        version=None,
        files=tuple(os.path.abspath(f) if _local_path(f) == f else f for f in files),
        partitions=tuple(parts),
        schema=schema,
        partition_columns=part_cols,
    )


def _hive_partitions(path: str, root: str | None) -> dict[str, str]:
    rel = os.path.relpath(path, root) if root and _local_path(path) == path else path
    out = {}
    for seg in Path(rel).parts[:-1]:
        key, sep, value = seg.partition("=")
        if sep:
            out[key] = value
    return out
