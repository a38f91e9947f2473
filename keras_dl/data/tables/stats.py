"""How many live rows a snapshot selects: in all, per file and per row group, counted from the
Delta log when it says, else from the files' footers (which also checks the columns)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keras_dl.data.tables.rows import (
    check_file,
    group_live_rows,
    load_row_group,
    open_file,
    stored_names,
)
from keras_dl.data.tables.skipping import group_may_match
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError


@dataclass(frozen=True)
class TableStats:
    """How many live rows a snapshot selects: in all, per file, and per row group if known.

    ``file_rows`` is all the shard planner needs (:mod:`keras_dl.data.stream.shards`): shard ``s`` of
    ``S`` reads ``rows // S`` rows or one more, whatever the row groups. ``group_rows`` (per
    file, per row group) is known when the footers were read, and needed when row filters
    decide which rows live.
    """

    rows: int
    row_groups: int | None  # None: counted from the Delta log, no footer opened
    files: int
    bytes: int = 0
    file_rows: tuple[int, ...] = ()
    group_rows: tuple[tuple[int, ...], ...] | None = None
    rows_scanned: int | None = None  # rows of the row groups a filter was applied to
    row_groups_skipped: int = 0  # row groups the filters skipped by their footer statistics

    def check_shards(self, num_shards: int, table: str) -> None:
        """Refuse more shards than live rows: every rank must read at least one row.

        Raises:
            DataError: Naming the table, the counts and the fixes.
        """
        if self.rows < num_shards:
            raise DataError(
                f"Table {table!r} has {self.rows} live row(s) but {num_shards} shards (ranks) "
                "must each read at least one. Use at most that many processes, or add rows."
            )

    def shard_rows(self, shard: int, num_shards: int) -> int:
        """Rows that shard ``shard`` of ``num_shards`` reads in every epoch: ``rows // num_shards``,
        and one more for each of the first ``rows % num_shards`` shards (as
        :func:`keras_dl.data.stream.shards.shard_sizes` plans them)."""
        base, extra = divmod(self.rows, max(num_shards, 1))
        return base + (shard < extra)


def count_rows(snapshot: TableSnapshot, columns: Sequence[str] = ()) -> TableStats:
    """Live rows per file: from the Delta log when it says (no footer is opened), else from
    the footers (:func:`scan_table`, which also checks ``columns``)."""
    live = snapshot.live_records()
    if live is None:
        return scan_table(snapshot, columns)
    return TableStats(rows=sum(live), row_groups=None, files=len(live), file_rows=live)


def scan_table(snapshot: TableSnapshot, columns: Sequence[str] = ()) -> TableStats:
    """Read every file's footer: count live rows per row group, and check ``columns``.

    Raises:
        DataError: For a file that is not valid Parquet, or that lacks or retypes one of
            ``columns`` (named by file), or a column with nulls (named by file and row group).
    """
    size = scanned = skipped = 0
    per_file: list[tuple[int, ...]] = []
    filtered = [c for c, _, _ in snapshot.row_filters]
    for index in range(len(snapshot.files)):
        pf = open_file(snapshot, index)
        check_file(snapshot, index, pf, columns)
        meta = pf.metadata
        if snapshot.row_filters:
            stored = stored_names(snapshot, pf.schema_arrow, filtered)
            counts = []
            for rg in range(meta.num_row_groups):
                if snapshot.data_skipping and not group_may_match(snapshot, meta, rg, stored):
                    skipped += 1  # its statistics prove no row matches: not read
                    counts.append(0)
                    continue
                scanned += meta.row_group(rg).num_rows
                counts.append(load_row_group(snapshot, index, pf, rg, []).num_rows)
            groups = tuple(counts)
        else:
            groups = group_live_rows(snapshot, index, meta)
        per_file.append(groups)
        size += sum(meta.row_group(rg).total_byte_size for rg in range(meta.num_row_groups))
    file_rows = tuple(sum(g) for g in per_file)
    return TableStats(
        rows=sum(file_rows),
        row_groups=sum(len(g) for g in per_file),
        files=len(snapshot.files),
        bytes=size,
        file_rows=file_rows,
        group_rows=tuple(per_file),
        rows_scanned=scanned if snapshot.row_filters else None,
        row_groups_skipped=skipped,
    )
