"""``read_table``: the rows training would see, as a ``pyarrow.Table``.

It opens the same snapshot and reads through the same Petastorm reader and row-group loader as
training, so what a notebook inspects is what a model is fed: deleted rows are gone, columns
carry their logical names and the table's types (dates, timestamps, decimals, lists, structs,
partition columns), and a null partition value is a null.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables import open_table
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.data.tables.snapshot import Filter, TableSnapshot
from keras_dl.data.tables.stats import scan_table
from keras_dl.errors import DataError


def read_table(
    table: str | Sequence[str],
    version: int | None = None,
    timestamp: str | None = None,
    columns: Sequence[str] | None = None,
    filters: Sequence[str | Filter] | None = None,
    workers: int = 2,
    limit: int | None = None,
    since_version: int | None = None,
) -> pa.Table:
    """Read a Delta table (at a version or timestamp) or Parquet files into a ``pyarrow.Table``.

    Args:
        table: A Delta table path or URI, a Parquet folder, glob, or list of files.
        version: Delta version. Defaults to the latest.
        timestamp: ISO 8601 time for Delta time travel. Defaults to None.
        columns: Columns to return, in this order. Defaults to all of them.
        filters: ``"COLUMN OP VALUE"`` strings (as ``data.filters``) or ``(column, op,
            value)`` tuples. Defaults to None.
        workers: Petastorm reader threads. Defaults to 2.
        limit: Stop after this many rows (the first ones in file order). Defaults to None.
        since_version: Only the rows added after this Delta version and still live at
            ``version`` (``data.since_version``). Defaults to None (the whole table).

    Returns:
        The rows in file order (files as the log lists them, row groups in file order).

    Raises:
        DataError: For a table that cannot be read exactly, or an unknown column.

    Example:
        >>> from keras_dl.data import read_table
        >>> read_table("data/digits", version=0, columns=["label"]).num_rows  # doctest: +SKIP
        1797
    """
    snapshot = open_table(table, version, timestamp, since_version=since_version)
    if snapshot.read_by_rows:
        raise DataError(
            f"{snapshot.uri!r} is a Petastorm dataset (codec-encoded columns): read_table reads "
            "Delta and Parquet tables. Train on it with make_dataset, or decode it with "
            "petastorm.make_reader."
        )
    if filters:
        parsed = [
            parse_filters([f], snapshot.schema)[0] if isinstance(f, str) else f for f in filters
        ]
        snapshot = select(snapshot, parsed)
    return read_snapshot(snapshot, columns, workers, limit)


def read_snapshot(
    snapshot: TableSnapshot,
    columns: Sequence[str] | None = None,
    workers: int = 2,
    limit: int | None = None,
) -> pa.Table:
    """The live rows of an opened snapshot (filters, splits and change ranges as it holds them),
    in file order; see :func:`read_table` for the arguments."""
    names = list(columns) if columns is not None else list(snapshot.schema.names)
    missing = [c for c in names if c not in snapshot.schema.names]
    if missing:
        raise DataError(
            f"Column(s) {', '.join(map(repr, missing))} are not in table {snapshot.uri!r}. Its "
            f"columns: {', '.join(snapshot.schema.names)}."
        )
    schema = pa.schema([snapshot.schema.field(c) for c in names])
    stats = scan_table(snapshot)
    tables, rows = [], 0
    for part in iter_epoch(snapshot, names, stats, shuffle=False, seed=None, workers=workers):
        tables.append(part)
        rows += part.num_rows
        if limit is not None and rows >= limit:
            break  # closing the generator stops and joins the reader
    if not tables:
        return schema.empty_table()
    out = pa.concat_tables(tables).cast(schema)
    return out if limit is None else out.slice(0, limit)
