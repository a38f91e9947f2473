"""The row-group worker keras_dl's Petastorm readers run on their pool's threads.

:func:`worker_class` is Petastorm's Arrow worker with keras_dl's loading: each row group comes
through :func:`keras_dl.data.tables.rows.load_row_group` (the table's rows: names, types, partition
values, no deleted row), a boundary row group keeps only this shard's rows, and each file's
footer is parsed once per reader. Given a
:class:`~keras_dl.data.stream.prefetch.RowGroupPrefetch`, a row group is decoded from the bytes
it fetched ahead (in the planned order) instead of being read column by column. Given a ``convert`` function, the worker also turns the row
group into what the reader's consumer wants (numpy arrays, packed features) on the pool's
threads, beside the decoding, and publishes a :class:`Converted` result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import pyarrow as pa

from keras_dl.data.petastorm_compat.row_groups import key as _key
from keras_dl.data.stream.prefetch import RowGroupPrefetch
from keras_dl.data.stream.shards import keep_mask
from keras_dl.data.tables.rows import load_row_group, open_file
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError

Convert = Callable[[pa.Table, int, int], object]  # (row group's table, file index, row group)
# (loader, convert, file index, row group) -> what a worker publishes: see load_and_convert
LoadAndConvert = Callable[[Callable, Convert | None, int, int], object]


class Converted(NamedTuple):
    """A row group converted on a reader's worker thread: its rows, and what ``convert``
    returned or the exception it raised."""

    rows: int
    value: object
    error: BaseException | None = None


def load_and_convert(load, convert: Convert | None, index: int, row_group: int):
    """One row group as a reader's worker hands it on: the table (no ``convert``), a
    :class:`Converted` (its error kept, not raised), or None when it has no rows."""
    table = load(index, row_group)
    if not table:
        return None
    if convert is None:
        return table
    try:
        return Converted(table.num_rows, convert(table, index, row_group))
    except Exception as exc:  # raised by read_pieces, in the order of the reads
        return Converted(table.num_rows, None, exc)


def worker_class(
    snapshot: TableSnapshot,
    columns: tuple[str, ...],
    index_of,
    keep,
    convert=None,
    prefetch: RowGroupPrefetch | None = None,
    load: LoadAndConvert = load_and_convert,
):
    """Petastorm's Arrow worker, loading each row group through ``load_row_group`` (from the
    bytes ``prefetch`` fetched, when given) and keeping the piece's rows (``keep``:
    ``(file, row group) -> runs or None``), then ``convert``-ing it when given one (its error
    is published in order, as the result, not raised in the worker thread: Petastorm would
    print that thread's traceback). Each row group goes through ``load`` (called as
    :func:`load_and_convert` is; the benchmarks pass one that times it)."""
    from petastorm.arrow_reader_worker import ArrowReaderWorker
    from petastorm.workers_pool import EmptyResultError

    class ResultsReader:
        batched_output = True

        def read_next(self, workers_pool, schema, ngram):
            try:
                return workers_pool.get_results()  # a pyarrow.Table: no namedtuple of columns
            except EmptyResultError:
                raise StopIteration from None

    loader = row_group_loader(snapshot, columns, keep, prefetch)  # footers shared by its workers

    class SnapshotWorker(ArrowReaderWorker):
        @staticmethod
        def new_results_queue_reader():
            return ResultsReader()

        def process(self, piece_index, worker_predicate, shuffle_row_drop_partition):
            # Petastorm's own process opens the file, parsing its footer, for every row group
            # (2.5 ms for 200 columns), then calls _load_rows, which this process replaces:
            # each footer is parsed once per reader here. keras_dl passes no predicate, cache
            # or ngram, the rest of it.
            if worker_predicate is not None:
                raise NotImplementedError("keras_dl's reader takes no Petastorm predicate")
            piece = self._split_pieces[piece_index]
            result = load(loader, convert, index_of[_key(piece.path)], piece.row_group)
            if result is not None:  # as Petastorm's: an empty table is not published
                self.publish_func(result)

    return SnapshotWorker


def row_group_loader(
    snapshot: TableSnapshot,
    columns: tuple[str, ...],
    keep,
    prefetch: RowGroupPrefetch | None = None,
):
    """``load(file index, row group) -> pyarrow.Table``: the row group's table rows (through
    ``load_row_group``, pages checked against their checksums), masked to ``keep``'s runs for a
    boundary row group; each file's footer is parsed once per loader. With ``prefetch``, the
    row group is decoded from the bytes it fetched ahead (read the ordinary way if it has none)."""
    footers: dict = {}  # file index -> its parsed footer

    def load(index: int, row_group: int) -> pa.Table:
        with _fetched(prefetch, index, row_group) as fetched:
            if fetched is None:
                pq_file = open_file(snapshot, index, metadata=footers.get(index))
            else:
                source, footer = fetched
                pq_file = open_file(snapshot, index, metadata=footer, source=source)
            footers[index] = pq_file.metadata
            if row_group >= pq_file.metadata.num_row_groups:
                raise DataError(
                    f"File {snapshot.files[index]!r} has no row group {row_group}: it changed "
                    "after the table was planned. Retry; if it persists, restore the file."
                )
            table = load_row_group(snapshot, index, pq_file, row_group, columns)
        runs = keep.get((index, row_group))
        if runs is not None:  # a boundary row group: the other shards' rows are masked
            table = table.filter(pa.array(keep_mask(runs, table.num_rows)))
        return table

    return load


def _fetched(prefetch: RowGroupPrefetch | None, index: int, row_group: int):
    """The row group's fetched bytes and footer (None: none fetched), held while decoding."""
    if prefetch is None:
        return contextlib.nullcontext(None)
    return prefetch.fetched(index, row_group)
