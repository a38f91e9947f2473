"""How many of a split's trained rows match a predicate or a list of row ids.

Three ways to answer, tried in this order:

- **row ids**: from the manifest alone (``baseRowId`` + position), no read at all;
- **lineage columns**: a predicate on ``data.lineage_columns`` only is evaluated on the values
  kept beside the manifest, which outlive VACUUM;
- **time travel**: the table is opened at the version (or ``since_version`` range) trained on
  and the predicate's columns are read at the trained positions of each file.

When none can (the trained files were vacuumed and the predicate needs a column the manifest
did not keep, or the path now holds another table), the count is None with the reason: never a
silent zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from keras_dl.data.tables import open_table
from keras_dl.data.tables.filters import filter_column, parse_filters, row_mask
from keras_dl.errors import KerasDLError
from keras_dl.lineage.file_rows import read_file
from keras_dl.lineage.manifest import SplitManifest


@dataclass(frozen=True)
class Count:
    """A split's trained rows that match: ``rows`` (None when it cannot be told, ``reason``
    says why) and ``how`` it was told ("row ids", "lineage columns", "time travel")."""

    rows: int | None
    how: str = ""
    reason: str = ""


class TableReader:
    """Opens trained versions and reads files for one query, each once (50 versions of one
    nightly loop share most of their files)."""

    def __init__(self):
        self._snapshots: dict = {}
        self._files: dict = {}

    def snapshot(self, m: SplitManifest):
        key = (m.table, m.version, m.since_version)
        if key not in self._snapshots:
            try:
                self._snapshots[key] = open_table(m.table, m.version, since_version=m.since_version)
            except KerasDLError as exc:
                self._snapshots[key] = exc
        return self._snapshots[key]

    def column_values(self, snapshot, index: int, columns: Sequence[str]) -> pa.Table:
        key = (snapshot.files[index], tuple(columns))
        if key not in self._files:
            self._files[key] = read_file(snapshot, index, columns)
        return self._files[key]


def count_row_ids(m: SplitManifest, ids: np.ndarray) -> Count:
    """Trained rows of ``m`` whose Delta row id is in ``ids``."""
    if not m.row_tracking:
        return Count(
            None,
            reason=f"table {m.table!r} had no row tracking when this split was read (no "
            "baseRowId in its log): its rows have no ids. Ask with --where instead.",
        )
    return Count(int(np.isin(m.row_ids(), ids).sum()), "row ids")


def count_where(
    m: SplitManifest,
    where: Sequence[str],
    values: Callable[[], pa.Table | None],
    reader: TableReader,
) -> Count:
    """Trained rows of ``m`` matching every ``"COLUMN OP VALUE"`` of ``where`` (ANDed).

    Args:
        m: The split's manifest.
        where: The predicate, in the language of ``data.filters``.
        values: Loads the split's lineage-column values (None when it kept none).
        reader: The query's :class:`TableReader`.
    """
    needed = {filter_column(w) or w for w in where}
    kept = needed <= set(m.lineage_columns)
    if kept:
        table = values()
        if table is not None:
            return Count(_count(table, where), "lineage columns")
    snapshot = reader.snapshot(m)
    version = _version_text(m)
    if isinstance(snapshot, KerasDLError):
        return Count(None, reason=_unreadable(m, version, str(snapshot)))
    if m.table_id is not None and snapshot.table_id != m.table_id:
        return Count(
            None,
            reason=_unreadable(
                m,
                version,
                f"the path now holds another table (metaData.id {snapshot.table_id}, trained "
                f"on {m.table_id}): it was dropped and written again",
            ),
        )
    index = {
        (snapshot.file_info[i]["path"] if snapshot.file_info else f): i
        for i, f in enumerate(snapshot.files)
    }
    columns = sorted(needed)
    parts = []
    for f in m.files:
        if not f.ranges:
            continue
        if f.path not in index:
            return Count(None, reason=_unreadable(m, version, f"its log no longer lists {f.path}"))
        try:
            table = reader.column_values(snapshot, index[f.path], columns)
        except KerasDLError as exc:
            return Count(None, reason=_unreadable(m, version, str(exc)))
        parts.append(table.take(pa.array(f.positions())))
    if not parts:
        return Count(0, f"time travel to {version}")
    return Count(_count(pa.concat_tables(parts), where), f"time travel to {version}")


def _count(table: pa.Table, where: Sequence[str]) -> int:
    mask = row_mask(table, parse_filters(list(where), table.schema))
    return table.num_rows if mask is None else int(np.asarray(mask, dtype=bool).sum())


def _version_text(m: SplitManifest) -> str:
    if m.since_version is not None:
        return f"versions ({m.since_version},{m.version}]"
    return f"version {m.version}" if m.version is not None else "its files"


def _unreadable(m: SplitManifest, version: str, why: str) -> str:
    kept = ", ".join(m.lineage_columns) or "none"
    return (
        f"cannot tell: {version} of {m.table!r} is no longer readable ({why}), and the "
        f"predicate needs columns the manifest did not keep (data.lineage_columns: {kept}). "
        "Train with data.lineage_columns naming the predicate's columns to answer after VACUUM."
    )
