"""The sources of a mixed training split: ``data.sources``, or ``data.replay`` as two of them.

:func:`open_sources` opens each source's table at its own version, with its own
``since_version`` and filters (and ``data.filters``, ``data.cache_dir``), as one table's split
is opened; :func:`check_same_columns` refuses sources whose columns differ from the feature
plan (each source is read with the same plan, so a missing or differently typed column would
fail inside tf.data, far from its cause).
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_dl.config import DataConfig
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.tables import open_table
from keras_dl.data.tables.disk_copy import cache_files
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError

REPLAY, NEW = "replay", "new"  # the two sources of data.replay


@dataclass(frozen=True)
class Source:
    """One opened source: its name, weight and snapshot (its training rows)."""

    name: str
    weight: float
    snapshot: TableSnapshot


def mixes(data: DataConfig) -> bool:
    """Whether ``data`` trains on a mix (``data.sources`` or ``data.replay``)."""
    return bool(data.sources) or data.replay is not None


def open_sources(data: DataConfig) -> list[Source]:
    """Each source's training rows (``data.split_column = data.train_split`` when set).

    ``data.replay=r`` with ``data.since_version=N`` is the sources ``replay`` (the rows of
    ``data.table`` at version N still live at ``data.version``, weight r: :func:`rows_kept`)
    and ``new`` (the rows versions N+1.. added, weight 1 - r).

    Raises:
        DataError: A table that cannot be opened (named), a source without training rows.
    """
    if data.replay is not None:
        specs = [
            (REPLAY, data.table, data.version, None, (), data.replay),
            (NEW, data.table, data.version, data.since_version, (), 1 - data.replay),
        ]
    else:
        specs = [
            (s.name, s.table, s.version, s.since_version, s.filters, s.weight) for s in data.sources
        ]
    out = []
    for name, table, version, since, filters, weight in specs:
        snapshot = open_table(
            table, version, None, data.trust_petastorm_metadata, since_version=since
        )
        if name == REPLAY and data.replay is not None:
            old = open_table(table, data.since_version, None, data.trust_petastorm_metadata)
            snapshot = rows_kept(snapshot, old)
        rules = parse_filters(tuple(data.filters) + tuple(filters), snapshot.schema)
        if data.split_column:
            if data.split_column not in snapshot.schema.names:
                raise DataError(
                    f"data.sources {name!r}: data.split_column={data.split_column!r} is not a "
                    f"column of table {snapshot.uri!r}. Its columns: "
                    f"{', '.join(snapshot.schema.names)}."
                )
            rules = [*rules, (data.split_column, "=", data.train_split)]
        if rules:
            snapshot = select(snapshot, rules)
        if data.cache_dir:
            snapshot = cache_files(snapshot, data.cache_dir, data.cache_dir_max_bytes)
        out.append(Source(name, float(weight), snapshot))
    return out


def rows_kept(current: TableSnapshot, old: TableSnapshot) -> TableSnapshot:
    """The rows of ``old`` (a table at ``data.since_version``) still live in ``current`` (the
    same table at the version trained): ``current``'s files that ``old`` held too, with
    ``current``'s deletion vectors. Rows deleted since are never replayed.

    A Delta file's rows never change, so a row of ``old`` is live in ``current`` exactly when
    its file is still there and no deletion vector of ``current`` removed it. Rows that a
    later copy-on-write DELETE or UPDATE rewrote into a new file are not replayed: their new
    file is not ``old``'s, and they were not added since either.
    """
    held = set(old.files)
    return current.take(i for i, f in enumerate(current.files) if f in held)


def epoch_rows(data: DataConfig, rows: list[int]) -> int | None:
    """Rows per mixed epoch: ``data.epoch_rows``; with ``data.replay``, the new rows divided
    by ``1 - replay`` (rounded), so each new row trains once an epoch; else every source's."""
    if data.epoch_rows is not None:
        return data.epoch_rows
    if data.replay is not None:
        return max(1, round(rows[1] / (1 - data.replay)))
    return None


def check_same_columns(sources: list[Source], plan: ColumnPlan) -> None:
    """Refuse a source that lacks a column of ``plan`` or holds it in another type.

    Raises:
        DataError: Naming the source, its table, the column and both types.
    """
    first = sources[0]
    for source in sources[1:]:
        schema = source.snapshot.schema
        for column in plan.columns:
            want = first.snapshot.schema.field(column).type
            if column not in schema.names:
                raise DataError(
                    f"data.sources {source.name!r} (table {source.snapshot.uri!r}) has no "
                    f"column {column!r}, which source {first.name!r} has and the features use. "
                    "All sources share the feature plan: add the column, or drop it with "
                    "data.features."
                )
            got = schema.field(column).type
            if got != want:
                raise DataError(
                    f"data.sources {source.name!r} (table {source.snapshot.uri!r}): column "
                    f"{column!r} is {got}, but {want} in source {first.name!r}. All sources "
                    "share the feature plan: cast the column to one type in both tables."
                )
