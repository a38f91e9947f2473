"""Look at a table before training on it: its layout against the planned workers, and a few rows.

Sharding is by row group, so a table with fewer row groups than ranks leaves ranks without data,
and with fewer than about two per rank leaves them unevenly loaded. :func:`describe_table`
counts files, row groups and rows per partition from the Parquet footers (no data is read) and
says whether the layout fits ``workers`` ranks, and how to fix it when it does not.

Example:
    >>> from keras_dl.explore import describe_table, read_sample
    >>> print(describe_table("data/digits", workers=2, split_column="split"))  # doctest: +SKIP
    >>> read_sample("data/digits", rows=8)                                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keras_dl.data.tables import open_table
from keras_dl.data.tables.filters import select
from keras_dl.data.tables.stats import scan_table
from keras_dl.data.training_rows import read_table
from keras_dl.errors import DataError


@dataclass(frozen=True)
class PartLayout:
    """Files, row groups and rows of one partition value (or of the whole table)."""

    name: str
    files: int
    row_groups: int
    rows: int


@dataclass(frozen=True)
class TableReport:
    """A table's layout and what it means for ``workers`` ranks."""

    uri: str
    format: str
    version: int | None
    schema: str
    workers: int
    parts: tuple[PartLayout, ...]
    problems: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when every partition has at least one live row per worker (shards are cut by
        rows, so any number of row groups trains on any number of workers up to that)."""
        return not self.problems

    def __str__(self) -> str:
        lines = [f"{self.format} table {self.uri} (version {self.version})"]
        for p in self.parts:
            per = p.row_groups / self.workers
            lines.append(
                f"  {p.name:<20} {p.rows:>9} rows  {p.files:>4} files  {p.row_groups:>5} row groups"
                f"  ({per:.1f} per worker of {self.workers})"
            )
        lines += [f"  ! {m}" for m in self.problems] or [
            f"  ok: every partition has >= {self.workers} rows for {self.workers} workers"
        ]
        lines += [f"  note: {m}" for m in self.notes]
        return "\n".join(lines)


def describe_table(
    table: str, workers: int = 1, version: int | None = None, split_column: str | None = None
) -> TableReport:
    """Count files, row groups and rows (per ``split_column`` value) and check them against
    ``workers`` ranks.

    Args:
        table: A Delta table or Parquet path.
        workers: Ranks that will read it (Horovod processes, or 1). Defaults to 1.
        version: Delta version. Defaults to the latest.
        split_column: A partition column to break the counts down by (each split is sharded
            on its own). Defaults to None (the whole table).

    Returns:
        The layout, a problem line per partition with fewer rows than workers, and a note per
        partition with fewer row groups than workers (they share row groups: it trains exactly,
        each decoding the shared groups whole).
    """
    snapshot = open_table(table, version)
    if split_column and split_column not in snapshot.partition_columns:
        raise DataError(
            f"{split_column!r} is not a partition column of table {snapshot.uri!r} (partition "
            f"columns: {', '.join(snapshot.partition_columns) or 'none'}), so its row groups mix "
            "splits. Drop split_column to count the whole table."
        )
    groups: dict[str, list[int]] = {}
    values = (
        sorted({p.get(split_column) for p in snapshot.partitions}, key=str)
        if split_column
        else [None]
    )
    for value in values:
        name = f"{split_column}={value}" if split_column else "all rows"
        part = select(snapshot, [(split_column, "=", value)]) if split_column else snapshot
        if split_column and value is None:  # a null partition: SQL filters match no null
            part = snapshot.take(
                i for i, p in enumerate(snapshot.partitions) if p.get(split_column) is None
            )
        stats = scan_table(part)  # live rows: deletion vectors applied
        groups[name] = [stats.files, stats.row_groups, stats.rows]
    parts = tuple(PartLayout(n, *v) for n, v in sorted(groups.items()))
    problems, notes = [], []
    for p in parts:
        if p.rows < workers:
            problems.append(
                f"{p.name}: {p.rows} row(s) for {workers} workers: every worker must read at "
                "least one row. Use fewer workers, or add rows."
            )
        elif p.row_groups < workers:
            notes.append(
                f"{p.name}: {p.row_groups} row group(s) for {workers} workers, so workers share "
                "row groups: each decodes a shared group whole and keeps its own rows (exact, "
                "at the cost of decoding). For less decoding, rewrite it with smaller row groups "
                f"(keras-dl ingest ... --rows-per-group {max(1, p.rows // (2 * workers))})."
            )
    return TableReport(
        uri=snapshot.uri,
        format=snapshot.format,
        version=snapshot.version,
        schema=str(snapshot.schema),
        workers=workers,
        parts=parts,
        problems=tuple(problems),
        notes=tuple(notes),
    )


def read_sample(table: str, rows: int = 8, version: int | None = None, columns=None):
    """The first ``rows`` rows of a table version as a pandas DataFrame, as training reads them
    (deleted rows gone, logical column names, typed partition columns)."""
    return read_table(table, version=version, columns=columns, limit=rows).to_pandas()
