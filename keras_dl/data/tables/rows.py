"""The rows a snapshot holds: one row group at a time, exactly as the table defines them.

:func:`load_row_group` is the one place that turns a row group of a Parquet file into the table's
rows: physical names and field ids become logical names (Delta column mapping), types become the
table's (timestamps, widened types), partition columns get their typed values from the snapshot,
deleted rows (deletion vectors) are dropped, and the snapshot's row filters are applied. The
Petastorm workers call it for every row group they read, and :func:`scan_table` counts with the
same rules, so row counts, steps and the rows read always agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from keras_dl.data.tables.disk_cache import cached_copy
from keras_dl.data.tables.filters import row_mask
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError, KerasDLError
from keras_dl.storage.retry import retrying

_FIELD_ID = b"PARQUET:field_id"


def group_live_rows(snapshot: TableSnapshot, index: int, meta) -> tuple[int, ...]:
    """Live rows of each row group of file ``index`` from its footer and deletion vector.

    Not for snapshots with row filters (only a read can count those: use a scan's counts).
    """
    deleted = snapshot.deletions(index)
    out, offset = [], 0
    for rg in range(meta.num_row_groups):
        count = meta.row_group(rg).num_rows
        keep = _live_rows(deleted, offset, count)
        out.append(count if keep is None else int(keep.sum()))
        offset += count
    return tuple(out)


def check_file(snapshot: TableSnapshot, index: int, pf: pq.ParquetFile, columns) -> None:
    """Check that file ``index`` holds ``columns`` with the table's types and no nulls (from
    its footer statistics); each problem is a DataError naming the file (and row group)."""
    path = snapshot.files[index]
    stored = stored_names(snapshot, pf.schema_arrow, columns)
    _check_columns(snapshot, path, pf, stored, columns)
    for name in columns:
        if name in snapshot.partition_columns and snapshot.partitions[index].get(name) is None:
            raise DataError(
                f"Partition column {name!r} is null in file {path!r} of table "
                f"{snapshot.uri!r}. Features and labels cannot be null: filter those rows "
                f"out (data.filters) or leave {name!r} out of data.features."
            )
    if snapshot.deletions(index) is None:  # deleted rows may hold the nulls: the read says
        meta = pf.metadata
        leaves = _leaf_columns(meta, stored, columns)
        for rg in range(meta.num_row_groups):
            if leaves:
                _check_nulls(path, meta, rg, leaves)


def open_file(snapshot: TableSnapshot, index: int, metadata=None, source=None) -> pq.ParquetFile:
    """The Parquet file ``index`` of ``snapshot``, or a DataError naming it.

    Its pages are checked against their CRC checksums where the file has them. ``metadata``:
    its footer, when already read (it is not read again). ``source``: a file object to read
    it from (its bytes fetched ahead) instead of its path.
    """
    path = snapshot.files[index]
    try:
        if source is not None:  # in memory: each chunk is a view of it, not pre-buffered
            return pq.ParquetFile(
                source, metadata=metadata, page_checksum_verification=True, pre_buffer=False
            )
        if "://" not in path:
            return pq.ParquetFile(path, metadata=metadata, page_checksum_verification=True)
        return retrying(
            lambda: pq.ParquetFile(
                _open_uri(path), metadata=metadata, page_checksum_verification=True
            ),
            path,
        )
    except KerasDLError:  # the store stayed unreachable (StoreUnavailable)
        raise
    except Exception as exc:
        raise DataError(
            f"File {path!r} in table {snapshot.uri!r} is not readable Parquet ({exc}). Restore "
            "or remove the file (for Delta, restore an earlier version), then retry."
        ) from None


def load_row_group(
    snapshot: TableSnapshot,
    index: int,
    pf: pq.ParquetFile,
    row_group: int,
    columns: Sequence[str],
) -> pa.Table:
    """Row group ``row_group`` of file ``index`` as the table's rows, for logical ``columns``.

    Raises:
        DataError: When the row group cannot be read (a damaged page, a failed page checksum),
            naming the file and row group, or a column cannot be converted to the table's type.
    """
    meta = pf.metadata
    offset = sum(meta.row_group(i).num_rows for i in range(row_group))
    count = meta.row_group(row_group).num_rows
    wanted = read_columns(snapshot, columns)
    stored = stored_names(snapshot, pf.schema_arrow, wanted)
    data_cols = [stored[c] for c in wanted if stored.get(c) is not None]
    try:
        raw = (
            retrying(lambda: pf.read_row_group(row_group, columns=data_cols), snapshot.files[index])
            if data_cols
            else None
        )
    except KerasDLError:  # the store stayed unreachable (StoreUnavailable)
        raise
    except Exception as exc:  # a damaged page: a failed checksum, or data that does not decode
        fix = (
            "It is data.cache_dir's local copy: delete it (it is copied again), then retry."
            if cached_copy(snapshot.files[index])
            else "If the file is damaged, restore it from a copy, or restore an earlier version "
            "of the table (Delta's RESTORE), then retry."
        )
        raise DataError(
            f"Reading file {snapshot.files[index]!r}, row group {row_group}, of table "
            f"{snapshot.uri!r} failed: {exc}. {fix}"
        ) from exc
    arrays = []
    for name in wanted:
        kind = snapshot.schema.field(name).type
        if name in snapshot.partition_columns:
            arrays.append(_constant(snapshot.partitions[index].get(name), kind, count))
        elif stored.get(name) is None:  # a column added after this file was written: nulls
            arrays.append(pa.nulls(count, kind))
        else:
            column = one_array(raw.column(stored[name]))
            arrays.append(_to_logical(column, kind, snapshot, name))
    table = pa.Table.from_arrays(arrays, names=wanted) if wanted else pa.table({})
    keep = _live_rows(snapshot.deletions(index), offset, count)
    if snapshot.row_filters:
        mask = np.asarray(row_mask(table, snapshot.row_filters), dtype=bool)
        keep = mask if keep is None else keep & mask
    if keep is not None:
        table = table.filter(pa.array(keep))
    return table.select(list(columns))


def read_columns(snapshot: TableSnapshot, columns: Sequence[str]) -> list[str]:
    """The logical columns a read of ``columns`` loads: them, then the row filters' columns."""
    return list(dict.fromkeys([*columns, *(c for c, _, _ in snapshot.row_filters)]))


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is (``combine_chunks`` copies even that)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def stored_names(
    snapshot: TableSnapshot, file_schema: pa.Schema, columns: Sequence[str]
) -> dict[str, str | None]:
    """Logical column -> its name in this file (None when the file lacks it)."""
    out: dict[str, str | None] = {}
    by_id = None
    stored = set(file_schema.names)  # once: `.names` builds a new list on every access
    for name in columns:
        if name in snapshot.partition_columns:
            continue
        physical = snapshot.physical_field(name)
        field_id = (physical.metadata or {}).get(_FIELD_ID)
        if field_id is not None:  # column mapping: the field id identifies the column
            if by_id is None:
                by_id = {
                    (f.metadata or {}).get(_FIELD_ID): f.name
                    for f in file_schema
                    if (f.metadata or {}).get(_FIELD_ID) is not None
                }
            if field_id in by_id:
                out[name] = by_id[field_id]
                continue
        out[name] = physical.name if physical.name in stored else None
    return out


def _check_columns(snapshot, path, pf, stored, columns) -> None:
    for name in columns:
        if name in snapshot.partition_columns:
            continue
        if stored.get(name) is None:
            if snapshot.format == "delta":
                continue  # added to the table after this file was written: read as nulls
            raise DataError(
                f"File {path!r} of table {snapshot.uri!r} has no column {name!r}, which other "
                f"files have: the files' schemas differ. Its columns: "
                f"{', '.join(pf.schema_arrow.names)}. Rewrite the file with the table's schema."
            )
        got = pf.schema_arrow.field(stored[name]).type
        want = snapshot.schema.field(name).type
        if not _convertible(got, want):
            raise DataError(
                f"Column {name!r} is {got} in file {path!r} but {want} in the table "
                f"{snapshot.uri!r}: the files' schemas differ. Rewrite the file with one type."
            )


def _leaf_columns(meta, stored, columns) -> dict[str, int]:
    """Logical column -> the index of its (last) Parquet leaf in this file, once per file."""
    leaf = {meta.schema.column(i).path.split(".")[0]: i for i in range(meta.num_columns)}
    out = {}
    for name in columns:
        column = stored.get(name)
        if column is not None and column in leaf:
            out[name] = leaf[column]
    return out


def _check_nulls(path, meta, rg, leaves: dict[str, int]) -> None:
    for name, index in leaves.items():
        stats = meta.row_group(rg).column(index).statistics
        if stats is not None and stats.has_null_count and stats.null_count > 0:
            raise DataError(
                f"Column {name!r} has {stats.null_count} null value(s) in file {path!r}, row "
                f"group {rg}. Features and labels cannot be null: fill or drop those rows when "
                "writing the table, or leave the column out of data.features."
            )


def _live_rows(deleted: np.ndarray | None, offset: int, count: int) -> np.ndarray | None:
    """A keep-mask for rows ``offset .. offset+count`` of a file, or None when none is deleted."""
    if deleted is None or not len(deleted):
        return None
    lo, hi = np.searchsorted(deleted, [offset, offset + count])
    if lo == hi:
        return None
    keep = np.ones(count, dtype=bool)
    keep[deleted[lo:hi] - offset] = False
    return keep


def _constant(value, kind: pa.DataType, count: int) -> pa.Array:
    if value is None:
        return pa.nulls(count, kind)
    return pa.repeat(pa.scalar(value, type=kind), count)


def _to_logical(column: pa.Array, kind: pa.DataType, snapshot: TableSnapshot, name: str):
    """Rename nested physical fields and cast to the table's type."""
    try:
        return _convert(column, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise DataError(
            f"Column {name!r} of table {snapshot.uri!r} holds {column.type} values that do not "
            f"convert to the table's type {kind} ({exc}). Rewrite the file with that type."
        ) from None


def _convert(column: pa.Array, kind: pa.DataType) -> pa.Array:
    if column.type == kind:
        return column
    if pa.types.is_struct(kind) and pa.types.is_struct(column.type):
        # Children by position: column mapping renames them, the order is the table's.
        children = [
            _convert(column.field(i), kind[i].type)
            for i in range(min(kind.num_fields, column.type.num_fields))
        ]
        children += [
            pa.nulls(len(column), kind[i].type) for i in range(len(children), kind.num_fields)
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(kind), mask=column.is_null() if column.null_count else None
        )
    if pa.types.is_list(kind) and (
        pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
    ):
        values = _convert(column.flatten(), kind.value_type)
        offsets = column.offsets.cast(pa.int32())
        if column.null_count:
            return pa.ListArray.from_arrays(offsets, values, mask=column.is_null())
        return pa.ListArray.from_arrays(offsets, values)
    if pa.types.is_timestamp(kind) and pa.types.is_timestamp(column.type):
        # INT96 and nanosecond files: Delta timestamps are microseconds, as Spark truncates.
        return column.cast(kind, safe=False)
    return column.cast(kind)


def _convertible(got: pa.DataType, want: pa.DataType) -> bool:
    if got == want:
        return True
    numeric = pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal
    if any(f(got) for f in numeric) and any(f(want) for f in numeric):
        return True  # type widening and Spark's integer/float choices cast exactly or fail loudly
    for family in (
        (pa.types.is_string, pa.types.is_large_string),
        (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary),
        (pa.types.is_timestamp,),
        (pa.types.is_date,),
        (pa.types.is_boolean,),
        (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list),
        (pa.types.is_struct,),
        (pa.types.is_map,),
    ):
        if any(f(got) for f in family) and any(f(want) for f in family):
            return True
    return False


def _open_uri(uri: str):
    from keras_dl.storage import filesystem

    fs, path = filesystem(uri)
    return fs.open_input_file(path)
