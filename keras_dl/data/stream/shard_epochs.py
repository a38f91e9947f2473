"""Petastorm over a snapshot: row-exact epochs per shard, one row group at a time.

This is the only module that makes Petastorm readers for tables. Which rows a shard reads in an
epoch is planned by :mod:`keras_dl.data.stream.shards` (runs of live rows, cut into row-group
:class:`~keras_dl.data.stream.shards.Piece` objects); Petastorm's ``Reader`` then does what it is good
at: it ventilates exactly those row groups, in the planned order, to a pool of worker threads
and hands back their results in that order. Its worker class is ours
(:mod:`~keras_dl.data.stream.row_group_worker`): each row group is loaded by
:func:`keras_dl.data.tables.rows.load_row_group`, so deleted rows never leave the reader, column
names, types and partition values are the table's, and a boundary row group keeps only this
shard's rows (masked as a deletion vector would be); the training stream's conversion to numpy
(and packing) runs there too, on the pool's threads.

Exactness rests on two things: the race fix in ``petastorm_compat.race`` (without it a finite
read could end with row groups in flight), and :func:`read_pieces` checking that every row
group returned exactly the rows planned. A short or long epoch is an error, never silently
different rows.

Beside it: :mod:`~keras_dl.data.stream.arrays` turns each row group into numpy arrays,
:mod:`~keras_dl.data.stream.shuffle` mixes rows in memory, and Petastorm datasets (a Unischema with
codecs) are read by :mod:`~keras_dl.data.stream.unischema_epochs`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from keras_dl.data.petastorm_compat.row_groups import key as _key
from keras_dl.data.petastorm_compat.row_groups import planned
from keras_dl.data.stream import shutdown
from keras_dl.data.stream.arrays import read_error, to_arrays
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.prefetch import RowGroupPrefetch, open_prefetch
from keras_dl.data.stream.read_options import IoOptions
from keras_dl.data.stream.row_group_worker import Convert, Converted, worker_class
from keras_dl.data.stream.shards import Piece, plan_epoch, plan_pieces, rng_seed
from keras_dl.data.stream.unischema_epochs import iter_unischema_rows
from keras_dl.data.tables.rows import check_file, group_live_rows, open_file
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.tables.stats import TableStats
from keras_dl.errors import DataError
from keras_dl.storage import file_url

DEFAULT_IO = IoOptions()  # data.io_concurrency and data.io_max_bytes' defaults
_RESULTS_QUEUE = 4  # row groups Petastorm's pool holds decoded ahead of the reader


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
) -> Iterator[tuple[Piece, Any]]:
    """Read ``pieces`` with Petastorm, in order, each masked to the rows it keeps.

    Args:
        convert: ``convert(table, file index, row group)``, run on the reader's worker threads
            beside the decoding (not on the thread that consumes the reads): the pieces are
            then yielded with what it returns instead of the ``pyarrow.Table``.
        near_end: Called once, when the read has handed out all but the last ``workers``
            pieces (those the reader's workers are decoding): the caller may start the next
            read then (:class:`~keras_dl.data.stream.next_epoch.ReadAhead`).
        io: How pieces on an object store are fetched ahead of the workers, in their order
            (:mod:`~keras_dl.data.stream.prefetch`). Defaults to :data:`DEFAULT_IO`.

    Raises:
        DataError: When a file cannot be read, or the rows read are not the rows planned.
    """
    if not pieces:
        return
    expected = sum(p.rows for p in pieces)
    shutdown.check_open()  # lifecycle: no reader opens once the interpreter is exiting
    prefetch = open_prefetch(snapshot, columns, pieces, io.concurrency, io.max_bytes)
    try:
        reader = open_reader(snapshot, columns, pieces, workers, convert, prefetch)
    except BaseException:
        if prefetch is not None:
            prefetch.close()
        raise
    shutdown.track(reader)  # lifecycle: stopped and joined at exit
    read = 0
    last = max(len(pieces) - max(workers, 1), 0)  # the first piece still in the workers' hands
    try:
        for i, piece in enumerate(pieces):
            shutdown.check_open()  # lifecycle: at exit, stop between row groups
            if i == last and near_end is not None:
                near_end()
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
    them, else from the file's footer and deletion vector, opened once (and checked)."""

    def __init__(self, snapshot: TableSnapshot, stats: TableStats, columns: Sequence[str] = ()):
        self.snapshot = snapshot
        self.stats = stats
        self.columns = tuple(columns)
        self.known: dict[int, tuple[int, ...]] = {}

    def __call__(self, index: int) -> tuple[int, ...]:
        if self.stats.group_rows is not None:
            return self.stats.group_rows[index]
        if index not in self.known:
            pf = open_file(self.snapshot, index)
            check_file(self.snapshot, index, pf, self.columns)
            self.known[index] = group_live_rows(self.snapshot, index, pf.metadata)
        return self.known[index]


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


def open_reader(
    snapshot: TableSnapshot,
    columns,
    pieces: Sequence[Piece],
    workers: int,
    convert: Convert | None = None,
    prefetch: RowGroupPrefetch | None = None,
):
    """A Petastorm ``Reader`` of ``pieces`` (in that order) with keras_dl's row-group worker
    (which publishes :class:`~keras_dl.data.stream.row_group_worker.Converted` results when
    given ``convert``, and decodes the bytes ``prefetch`` fetched, when given)."""
    from petastorm.fs_utils import get_filesystem_and_path_or_paths
    from petastorm.reader import normalize_dataset_url_or_urls
    from petastorm.workers_pool.thread_pool import ThreadPool

    from keras_dl.data import petastorm_compat

    petastorm_compat.install()  # the race fix, and every Arrow type in schema inference
    files = list(dict.fromkeys(p.file for p in pieces))
    urls = normalize_dataset_url_or_urls([file_url(snapshot.files[i]) for i in files])
    keep = {(p.file, p.row_group): p.keep for p in pieces}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fs, paths = _filesystem_and_paths(urls, get_filesystem_and_path_or_paths)
            paths = paths if isinstance(paths, list) else [paths]
            index_of = {_key(p): i for p, i in zip(paths, files)}
            order = [(_key(paths[files.index(p.file)]), p.row_group) for p in pieces]
            last = {}  # the highest row group planned per file: Petastorm lists no more
            for path, rg in order:
                last[path] = max(rg, last.get(path, -1))
            with planned(last):
                return _planned_reader(order)(
                    fs,
                    paths,
                    worker_class=worker_class(
                        snapshot, tuple(columns), index_of, keep, convert, prefetch
                    ),
                    # Thread workers: blocking, strict round-robin results (a seeded read is
                    # reproducible), and Petastorm buffers at most _RESULTS_QUEUE row groups each.
                    reader_pool=ThreadPool(workers, _RESULTS_QUEUE, shuffle_rows=False),
                    shuffle_rows=False,  # rows are mixed by the shuffle buffer, across row groups
                    shuffle_row_groups=False,  # the pieces come in the planned (seeded) order
                    num_epochs=1,
                    is_batched_reader=True,
                )
        except DataError:
            raise
        except Exception as exc:
            raise DataError(f"Petastorm cannot open table {snapshot.uri!r}: {exc}") from None


def _filesystem_and_paths(urls: list[str], petastorm_resolve):
    """Local files as Petastorm resolves them; object-store files through ``keras_dl.storage``
    (credentials and endpoint from the environment), wrapped for Petastorm's legacy dataset."""
    if all(u.startswith("file://") for u in urls):
        return petastorm_resolve(urls)
    from keras_dl.data.petastorm_compat import filesystem as compat_fs
    from keras_dl.storage import filesystem

    fs, _ = filesystem(urls[0])
    paths = [filesystem(u)[1] for u in urls]
    try:
        from pyarrow.filesystem import DaskFileSystem  # pyarrow < 16: its legacy fsspec wrapper
    except ImportError:
        # pyarrow >= 16 removed pyarrow.filesystem, DaskFileSystem with it (the name is then the
        # compat layer's module): its legacy FileSystem wraps the pyarrow.fs filesystem itself.
        return compat_fs.FileSystem(fs), paths
    from fsspec.implementations.arrow import ArrowFSWrapper

    class LegacyFileSystem(DaskFileSystem):
        # DaskFileSystem leaves these to subclasses; Petastorm's dataset discovery calls them.
        def isdir(self, path):
            return self.fs.isdir(path)

        def isfile(self, path):
            return self.fs.isfile(path)

    return LegacyFileSystem(ArrowFSWrapper(fs)), paths


def _planned_reader(order: list[tuple[str, int]]):
    """Petastorm's ``Reader``, ventilating exactly the row groups ``order`` names, in order."""
    from petastorm.reader import Reader

    class PlannedReader(Reader):
        def _filter_row_groups(self, dataset, row_groups, *args, **kwargs):
            at = {(_key(p.path), p.row_group): i for i, p in enumerate(row_groups)}
            missing = [k for k in order if k not in at]
            if missing:
                path, rg = missing[0]
                raise DataError(
                    f"File {path!r} has no row group {rg}: it changed after the table was "
                    "planned. Retry; if it persists, restore the file."
                )
            return [at[k] for k in order], None

    return PlannedReader
