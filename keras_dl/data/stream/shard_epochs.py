"""Petastorm over a snapshot: row-exact epochs per shard, one row group at a time.

This module (with :mod:`~keras_dl.data.stream.planned_reader`, which builds the reader) is the
only one that makes Petastorm readers for tables. Which rows a shard reads in an
epoch is planned by :mod:`keras_dl.data.stream.shards` (runs of live rows, cut into row-group
:class:`~keras_dl.data.stream.shards.Piece` objects); Petastorm's ``Reader`` then does what it is good
at: it ventilates exactly those row groups, in the planned order, to a pool of worker threads
and hands back their results in that order. Its worker class is ours
(:mod:`~keras_dl.data.stream.row_group_worker`): each row group is loaded by
:func:`keras_dl.data.tables.rows.load_row_group`, so deleted rows never leave the reader, column
names, types and partition values are the table's, and a boundary row group keeps only this
shard's rows (masked as a deletion vector would be); the training stream's conversion to numpy
(and packing) runs there too, on the pool's threads. From an object store, the planned row
groups are fetched ahead of the workers, in their order (:mod:`~keras_dl.data.stream.prefetch`).

Exactness rests on two things: the race fix in ``petastorm_compat.race`` (without it a finite
read could end with row groups in flight), and :func:`read_pieces` checking that every row
group returned exactly the rows planned. A short or long epoch is an error, never silently
different rows.

Beside it: :mod:`~keras_dl.data.stream.arrays` turns each row group into numpy arrays,
:mod:`~keras_dl.data.stream.shuffle` mixes rows in memory, and Petastorm datasets (a Unischema with
codecs) are read by :mod:`~keras_dl.data.stream.unischema_epochs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from keras_dl.data.stream import shutdown
from keras_dl.data.stream.arrays import read_error, to_arrays
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.planned_reader import open_reader
from keras_dl.data.stream.prefetch import open_prefetch
from keras_dl.data.stream.read_options import IoOptions
from keras_dl.data.stream.row_group_worker import (
    Convert,
    Converted,
    LoadAndConvert,
    load_and_convert,
)
from keras_dl.data.stream.shards import Piece, plan_epoch, plan_pieces, rng_seed
from keras_dl.data.stream.unischema_epochs import iter_unischema_rows
from keras_dl.data.tables.rows import check_file, group_live_rows, open_file
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.tables.stats import TableStats
from keras_dl.errors import DataError
from keras_dl.storage import local_path

DEFAULT_IO = IoOptions()  # data.io_concurrency and data.io_max_bytes' defaults


def iter_epoch(
    snapshot: TableSnapshot,
    columns: Sequence[str],
    stats: TableStats,
    *,
    shard: int = 0,
    num_shards: int = 1,
    shuffle: bool = False,
    seed: int | None = 42,
    workers: int = 2,
    groups: RowGroupCounts | None = None,
    io: IoOptions = DEFAULT_IO,
) -> Iterator[pa.Table]:
    """Yield this shard's rows of one epoch, a row group at a time, as ``pyarrow.Table``.

    The shard's rows are planned by :mod:`keras_dl.data.stream.shards` (``seed`` is the epoch's seed:
    pass a different one per epoch): ``stats.shard_rows(shard, num_shards)`` rows, exactly,
    which the shards together cover once. Results come back in the planned order, so a seeded
    read is reproducible whatever the number of workers. ``io``: how row groups on an object
    store are fetched ahead of the workers.

    Raises:
        DataError: When a file cannot be read, or the epoch did not return exactly this
            shard's rows.
    """
    pieces = epoch_pieces(snapshot, stats, shard, num_shards, shuffle, seed, groups, columns)
    reads = read_pieces(snapshot, columns, pieces, workers, what=(shard, num_shards), io=io)
    for _, table in reads:
        yield table


def epoch_pieces(
    snapshot: TableSnapshot,
    stats: TableStats,
    shard: int = 0,
    num_shards: int = 1,
    shuffle: bool = False,
    seed: int | None = None,
    groups: RowGroupCounts | None = None,
    columns: Sequence[str] = (),
) -> list[Piece]:
    """The row groups (and masks) of this shard's epoch, in the order they are read.

    Only the footers of the files this shard reads are opened (once per ``groups``).
    """
    if stats.rows == 0:
        return []  # nothing live (a read returns no rows; training refuses an empty split)
    stats.check_shards(num_shards, snapshot.uri)
    plan = plan_epoch(stats.file_rows, shard, num_shards, shuffle=shuffle, seed=seed)
    groups = groups or RowGroupCounts(snapshot, stats, columns)
    groups.load(file for file, _ in plan.files)
    return plan_pieces(plan, groups, shuffle=shuffle, seed=[rng_seed(seed), shard])


def read_pieces(
    snapshot: TableSnapshot,
    columns: Sequence[str],
    pieces: Sequence[Piece],
    workers: int = 2,
    what: tuple[int, int] = (0, 1),
    convert: Convert | None = None,
    near_end: Callable[[], None] | None = None,
    io: IoOptions = DEFAULT_IO,
    load: LoadAndConvert = load_and_convert,
) -> Iterator[tuple[Piece, Any]]:
    """Read ``pieces`` with Petastorm, in order, each masked to the rows it keeps.

    Args:
        convert: ``convert(table, file index, row group)``, run on the reader's worker threads
            beside the decoding (not on the thread that consumes the reads): the pieces are
            then yielded with what it returns instead of the ``pyarrow.Table``.
        near_end: Called once, when the read has handed out all but the last ``workers``
            pieces (those the reader's workers are decoding), or, fetching ahead from a
            store, once every piece is requested and a quarter of them are left to hand
            out: the caller may start the next read then
            (:class:`~keras_dl.data.stream.next_epoch.ReadAhead`).
        io: How pieces on an object store are fetched ahead of the workers, in their order
            (:mod:`~keras_dl.data.stream.prefetch`). Defaults to :data:`DEFAULT_IO`.
        load: How the reader's workers load and convert each row group, called as
            :func:`~keras_dl.data.stream.row_group_worker.load_and_convert` (the default) is;
            the benchmarks pass one that times it.

    Raises:
        DataError: When a file cannot be read, or the rows read are not the rows planned.
    """
    if not pieces:
        return
    expected = sum(p.rows for p in pieces)
    shutdown.check_open()  # lifecycle: no reader opens once the interpreter is exiting
    prefetch = open_prefetch(snapshot, columns, pieces, io.concurrency, io.max_bytes)
    try:
        reader = open_reader(snapshot, columns, pieces, workers, convert, prefetch, load)
    except BaseException:
        if prefetch is not None:
            prefetch.close()
        raise
    shutdown.track(reader)  # lifecycle: stopped and joined at exit
    read = 0
    last = max(len(pieces) - max(workers, 1), 0)  # the first piece still in the workers' hands
    soon = len(pieces) - len(pieces) // 4
    try:
        for i, piece in enumerate(pieces):
            shutdown.check_open()  # lifecycle: at exit, stop between row groups
            # Fetching from a store, the next read starts once this one has nothing left to
            # request, in its last quarter: the next reader's first round trips (its files'
            # footers, then its first row groups) overlap the decoding of this one's last
            # quarter, not only of the row groups in the workers' hands.
            ahead = prefetch is not None and prefetch.requested_all and i >= soon
            if near_end is not None and (i == last or ahead):
                near_end, tell = None, near_end
                tell()
            try:
                result = next(reader)
            except StopIteration:
                break
            except DataError:
                raise
            except Exception as exc:
                raise read_error(snapshot, exc) from exc
            if isinstance(result, Converted):
                if result.error is not None:
                    raise result.error
                rows, out = result.rows, result.value
            else:
                rows, out = result.num_rows, result
            read += rows
            if rows != piece.rows:
                break  # counted below: the epoch is refused
            yield piece, out
    finally:
        reader.stop()
        reader.join()
        if prefetch is not None:
            prefetch.close()
    if read != expected:
        shard, num_shards = what
        raise DataError(
            f"Reading table {snapshot.uri!r} (shard {shard} of {num_shards}) returned {read} "
            f"rows where its plan holds {expected}. The table changed while it was read, "
            "or the reader lost or repeated row groups: the epoch is refused rather than "
            "trained on. Retry; if it persists, report it with the table."
        )


class RowGroupCounts:
    """``fn(file index) -> live rows of each row group``, from a scan's counts when it has
    them, else from the file's footer and deletion vector, opened once (and checked).

    On an object store a footer costs round trips: :meth:`load` opens the footers of the files
    an epoch reads ``concurrency`` at a time, before the epoch's pieces are cut, so the first
    epoch waits for about one round trip per ``concurrency`` files, not one per file.
    """

    def __init__(
        self,
        snapshot: TableSnapshot,
        stats: TableStats,
        columns: Sequence[str] = (),
        concurrency: int = DEFAULT_IO.concurrency,
    ):
        self.snapshot = snapshot
        self.stats = stats
        self.columns = tuple(columns)
        self.concurrency = concurrency
        self.known: dict[int, tuple[int, ...]] = {}

    def __call__(self, index: int) -> tuple[int, ...]:
        if self.stats.group_rows is not None:
            return self.stats.group_rows[index]
        if index not in self.known:
            self.known[index] = self._open(index)
        return self.known[index]

    def load(self, indices: Iterable[int]) -> None:
        """Open the footers of ``indices`` not known yet, at once when they are on a store.

        Raises:
            DataError: A file that is not readable Parquet, or not the table's (the first
                such file of ``indices``, as one at a time would).
        """
        if self.stats.group_rows is not None:
            return
        missing = [i for i in dict.fromkeys(indices) if i not in self.known]
        remote = [i for i in missing if local_path(self.snapshot.files[i]) is None]
        if len(remote) < 2 or self.concurrency < 2:
            return  # local footers cost no round trip: opened when asked for
        workers = min(self.concurrency, len(remote))
        with ThreadPoolExecutor(workers, thread_name_prefix="keras_dl-footer") as pool:
            for index, counts in zip(remote, pool.map(self._open, remote)):
                self.known[index] = counts

    def _open(self, index: int) -> tuple[int, ...]:
        pf = open_file(self.snapshot, index)
        check_file(self.snapshot, index, pf, self.columns)
        return group_live_rows(self.snapshot, index, pf.metadata)


def iter_epoch_arrays(
    snapshot: TableSnapshot,
    plan: ColumnPlan,
    stats: TableStats,
    *,
    shard: int = 0,
    num_shards: int = 1,
    shuffle: bool = False,
    seed: int | None = 42,
    workers: int = 2,
) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of this shard as ``{column: array}`` chunks, for tables and Petastorm datasets.

    Tables are read by :func:`iter_epoch`, one row group per chunk. A Petastorm dataset (a
    Unischema with codecs) is read by Petastorm's row reader, ``make_reader``, which decodes the
    codecs (:mod:`keras_dl.data.stream.unischema_epochs`); its rows are stacked into chunks.
    """
    if not snapshot.read_by_rows:
        for table in iter_epoch(
            snapshot,
            plan.columns,
            stats,
            shard=shard,
            num_shards=num_shards,
            shuffle=shuffle,
            seed=seed,
            workers=workers,
        ):
            yield to_arrays(table, plan, snapshot)
        return
    yield from iter_unischema_rows(snapshot, plan, stats, shard, num_shards, shuffle, seed, workers)
