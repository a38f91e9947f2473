"""Which rows of one file a split trained, and the values of some of its columns at those rows.

A file's rows are named by their *physical* position (deleted rows count), the position Delta's
deletion vectors and row ids use, so the positions stay true after later deletes. The reads go
through :func:`keras_dl.data.tables.rows.load_row_group`, as training's do, with nothing dropped:
the deletion vector and the row filters are applied here, to positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa

from keras_dl.data.stream.row_ranges import EMPTY, complement, from_ids, runs
from keras_dl.data.tables.filters import row_mask
from keras_dl.data.tables.rows import load_row_group, open_file
from keras_dl.data.tables.snapshot import TableSnapshot


def trained_runs(
    snapshot: TableSnapshot, index: int, columns: Sequence[str] = ()
) -> tuple[np.ndarray, pa.Table | None]:
    """File ``index``'s rows that ``snapshot`` reads, as runs of positions, and ``columns``'
    values at them (None without ``columns``).

    Only the row filters' columns and ``columns`` are read, and nothing at all when neither is
    needed and the log counts the file's rows: the runs are then the file less its deletions.

    Raises:
        DataError: For a file that cannot be read, naming it (from the reader).
    """
    deleted = snapshot.deletions(index)
    records = snapshot.file_records[index] if snapshot.file_records else None
    if not snapshot.row_filters and not columns:
        if records is None:
            records = open_file(snapshot, index).metadata.num_rows
        gone = EMPTY if deleted is None else from_ids(np.asarray(deleted, dtype=np.int64))
        return complement(gone, int(records)) if records else EMPTY.copy(), None
    wanted = list(dict.fromkeys([*columns, *(c for c, _, _ in snapshot.row_filters)]))
    table = read_file(snapshot, index, wanted)
    keep = np.ones(table.num_rows, dtype=bool)
    if deleted is not None and len(deleted):
        keep[np.asarray(deleted, dtype=np.int64)] = False
    if snapshot.row_filters:
        keep &= np.asarray(row_mask(table, snapshot.row_filters), dtype=bool)
    positions = np.flatnonzero(keep)
    values = table.select(list(columns)).filter(pa.array(keep)) if columns else None
    return from_ids(positions), values


def read_file(snapshot: TableSnapshot, index: int, columns: Sequence[str]) -> pa.Table:
    """Every row of file ``index`` (deleted ones too, unfiltered) for logical ``columns``."""
    bare = replace(snapshot, row_filters=(), deleted_rows=())
    pf = open_file(snapshot, index)
    groups = [
        load_row_group(bare, index, pf, rg, list(columns))
        for rg in range(pf.metadata.num_row_groups)
    ]
    if not groups:
        return pa.table({c: pa.array([], snapshot.schema.field(c).type) for c in columns})
    if not columns:
        return pa.table({"_": pa.nulls(pf.metadata.num_rows)}).select([])
    return pa.concat_tables(groups)


def ranges_of(run_array: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Runs as a tuple of ``(lo, hi)`` pairs (the manifest's form)."""
    return tuple((int(lo), int(hi)) for lo, hi in runs(run_array).tolist())
