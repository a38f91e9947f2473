"""Petastorm over a snapshot: row-exact epochs per shard, one row group at a time.

This is the only module that makes Petastorm readers for tables. Which rows a shard reads in an
epoch is planned by :mod:`keras_dl.data.shards` (runs of live rows, cut into row-group
:class:`~keras_dl.data.shards.Piece` objects); Petastorm's ``Reader`` then does what it is good
at: it ventilates exactly those row groups, in the planned order, to a pool of worker threads
and hands back their results in that order. Its worker class is ours: each row group is loaded
by :func:`keras_dl.data.rows.load_row_group`, so deleted rows never leave the reader, column
names, types and partition values are the table's, and a boundary row group keeps only this
shard's rows (masked as a deletion vector would be).

Exactness rests on two things: the race fix in ``petastorm_compat.race`` (without it a finite
read could end with row groups in flight), and :func:`read_pieces` checking that every row
group returned exactly the rows planned. A short or long epoch is an error, never silently
different rows.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from keras_dl.data import reader_lifecycle
from keras_dl.data.features import NUMERIC, ColumnPlan, FeatureSpec
from keras_dl.data.rows import (
    TableStats,
    check_file,
    group_live_rows,
    load_row_group,
    one_array,
    open_file,
)
from keras_dl.data.shards import Piece, keep_mask, plan_epoch, plan_pieces
from keras_dl.data.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.storage import file_url

log = logging.getLogger(__name__)
_RESULTS_QUEUE = 4
CHUNK_ROWS = 256  # Petastorm datasets: decoded rows stacked per chunk handed to tf.data


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
) -> Iterator[pa.Table]:
    """Yield this shard's rows of one epoch, a row group at a time, as ``pyarrow.Table``.

    The shard's rows are planned by :mod:`keras_dl.data.shards` (``seed`` is the epoch's seed:
    pass a different one per epoch): ``stats.shard_rows(shard, num_shards)`` rows, exactly,
    which the shards together cover once. Results come back in the planned order, so a seeded
    read is reproducible whatever the number of workers.

    Raises:
        DataError: When a file cannot be read, or the epoch did not return exactly this
            shard's rows.
    """
    pieces = epoch_pieces(snapshot, stats, shard, num_shards, shuffle, seed, groups, columns)
    for _, table in read_pieces(snapshot, columns, pieces, workers, what=(shard, num_shards)):
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
    return plan_pieces(plan, groups, shuffle=shuffle, seed=[_seed(seed), shard])


def read_pieces(
    snapshot: TableSnapshot,
    columns: Sequence[str],
    pieces: Sequence[Piece],
    workers: int = 2,
    what: tuple[int, int] = (0, 1),
) -> Iterator[tuple[Piece, pa.Table]]:
    """Read ``pieces`` with Petastorm, in order, each masked to the rows it keeps.

    Raises:
        DataError: When a file cannot be read, or the rows read are not the rows planned.
    """
    if not pieces:
        return
    expected = sum(p.rows for p in pieces)
    reader_lifecycle.check_open()  # lifecycle: no reader opens once the interpreter is exiting
    reader = open_reader(snapshot, columns, pieces, workers)
    reader_lifecycle.track(reader)  # lifecycle: stopped and joined at exit
    read = 0
    try:
        for piece in pieces:
            reader_lifecycle.check_open()  # lifecycle: at exit, stop between row groups
            try:
                table = next(reader)
            except StopIteration:
                break
            except DataError:
                raise
            except Exception as exc:
                raise read_error(snapshot, exc) from exc
            read += table.num_rows
            if table.num_rows != piece.rows:
                break  # counted below: the epoch is refused
            yield piece, table
    finally:
        reader.stop()
        reader.join()
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
    codecs; its rows are stacked into chunks of ``CHUNK_ROWS``.
    """
    if snapshot.format != "petastorm":
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


def open_reader(snapshot: TableSnapshot, columns, pieces: Sequence[Piece], workers: int):
    """A Petastorm ``Reader`` of ``pieces`` (in that order) with keras_dl's row-group worker."""
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
            return _planned_reader(order)(
                fs,
                paths,
                worker_class=_worker_class(snapshot, tuple(columns), index_of, keep),
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


def to_arrays(table: pa.Table, plan: ColumnPlan, snapshot: TableSnapshot) -> dict[str, np.ndarray]:
    """One row group's planned columns as dense numpy arrays of their planned dtypes."""
    out = {}
    for spec in _specs(plan):
        column = table.column(spec.name)
        if column.null_count:
            raise DataError(
                f"Column {spec.name!r} of table {snapshot.uri!r} has {column.null_count} null "
                "value(s) in the rows read. Features and labels cannot be null: fill or drop "
                "those rows when writing the table, or leave the column out of data.features."
            )
        column = one_array(column) if isinstance(column, pa.ChunkedArray) else column
        if spec.kind != NUMERIC:
            out[spec.name] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
        elif spec.shape:
            out[spec.name] = _dense_lists(column, spec, snapshot)
        else:
            out[spec.name] = column.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    return out


def shuffle_rows(
    batches: Iterator[dict[str, np.ndarray]], buffer_rows: int, seed: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Mix rows across consecutive row groups, vectorized: fill ~``buffer_rows``, permute, emit.

    This is the in-memory level of shuffling; Petastorm shuffles row-group order beneath it.
    Every row that goes in comes out exactly once.
    """
    rng = np.random.default_rng(seed)
    pool: list[dict[str, np.ndarray]] = []
    pooled = 0
    for batch in batches:
        pool.append(batch)
        pooled += num_rows(batch)
        if pooled >= buffer_rows:
            yield _permute(pool, rng)
            pool, pooled = [], 0
    if pool:
        yield _permute(pool, rng)


def read_error(snapshot: TableSnapshot, exc: Exception) -> DataError:
    """Name the file and row group behind a reader error where that can be found."""
    m = re.search(r"values in column '([^']+)' are expected to be the same length", str(exc))
    if m:
        where = find_ragged(snapshot, m.group(1))
        if where:
            return _ragged_error(m.group(1), *where)
    return DataError(f"Reading table {snapshot.uri!r} failed: {exc}")


def find_ragged(snapshot: TableSnapshot, column: str):
    """``(file, row group, min length, max length)`` of the first ragged row group, or None."""
    import pyarrow.compute as pc

    for index, path in enumerate(snapshot.files):
        pf = open_file(snapshot, index)
        for rg in range(pf.num_row_groups):
            col = load_row_group(snapshot, index, pf, rg, [column]).column(0).combine_chunks()
            lengths = col.value_lengths()
            if len(lengths) and pc.min(lengths).as_py() != pc.max(lengths).as_py():
                return path, rg, pc.min(lengths).as_py(), pc.max(lengths).as_py()
    return None


def iter_unischema_rows(snapshot, plan, stats, shard, num_shards, shuffle, seed, workers):
    """A Petastorm (Unischema) dataset's rows of this shard, decoded by ``make_reader``.

    ``make_reader`` cannot be handed row groups in an order, so every shard reads the whole
    dataset in one seeded order (the same on every shard) and keeps the positions of its run,
    as planned for a table of one file: exact, at the cost of every shard decoding every row.
    """
    from petastorm import make_reader

    from keras_dl.data import petastorm_compat
    from keras_dl.data.tables.petastorm_meta import known_unischema

    petastorm_compat.install()  # Petastorm's own metadata unpickling is patched too
    if stats.rows == 0:
        return
    stats.check_shards(num_shards, snapshot.uri)
    runs = plan_epoch([stats.rows], shard, num_shards, shuffle=shuffle, seed=seed).files
    keep = keep_mask(runs[0][1], stats.rows) if runs else np.zeros(stats.rows, bool)
    expected = int(keep.sum())
    # make_reader would unpickle the Unischema again: hand it the one open_petastorm vetted.
    reader_lifecycle.check_open()  # lifecycle: no reader opens once the interpreter is exiting
    with warnings.catch_warnings(), known_unischema(snapshot.uri, snapshot.unischema):
        warnings.simplefilter("ignore")
        reader = make_reader(
            file_url(snapshot.uri),
            schema_fields=plan.columns,
            reader_pool_type="thread",
            workers_count=workers,
            results_queue_size=_RESULTS_QUEUE,
            num_epochs=1,
            shuffle_row_groups=shuffle,
            seed=seed if shuffle else None,
        )
    reader_lifecycle.track(reader)  # lifecycle: stopped at exit
    read = position = 0
    try:
        rows = []
        for row in reader:
            reader_lifecycle.check_open()  # lifecycle: at exit, stop between rows
            if position < len(keep) and keep[position]:
                rows.append(row)
            position += 1
            if len(rows) == CHUNK_ROWS:
                read += len(rows)
                yield _stack(rows, plan)
                rows = []
        if rows:
            read += len(rows)
            yield _stack(rows, plan)
    except (DataError, reader_lifecycle.ReadersClosed):  # lifecycle: not a read error
        raise
    except Exception as exc:
        raise DataError(f"Reading Petastorm dataset {snapshot.uri!r} failed: {exc}") from exc
    finally:
        reader.stop()
        reader.join()
    if read != expected or position != stats.rows:
        raise DataError(
            f"Reading Petastorm dataset {snapshot.uri!r} (shard {shard} of {num_shards}) "
            f"returned {position} rows ({read} of this shard) where its row groups hold "
            f"{stats.rows} ({expected} of this shard). Retry; if it persists, report it with "
            "the dataset."
        )


def _stack(rows, plan: ColumnPlan) -> dict[str, np.ndarray]:
    out = {}
    for name in plan.columns:
        values = [getattr(r, name) for r in rows]
        out[name] = np.stack(values) if np.ndim(values[0]) else np.asarray(values)
    return out


def num_rows(batch: dict[str, np.ndarray]) -> int:
    return len(next(iter(batch.values())))


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


def _worker_class(snapshot: TableSnapshot, columns: tuple[str, ...], index_of, keep):
    """Petastorm's Arrow worker, loading each row group through ``load_row_group`` and keeping
    the piece's rows (``keep``: ``(file, row group) -> runs or None``)."""
    from petastorm.arrow_reader_worker import ArrowReaderWorker
    from petastorm.workers_pool import EmptyResultError

    class ResultsReader:
        batched_output = True

        def read_next(self, workers_pool, schema, ngram):
            try:
                return workers_pool.get_results()  # a pyarrow.Table: no namedtuple of columns
            except EmptyResultError:
                raise StopIteration from None

    class SnapshotWorker(ArrowReaderWorker):
        @staticmethod
        def new_results_queue_reader():
            return ResultsReader()

        def _load_rows(self, pq_file, piece, shuffle_row_drop_range):
            index = index_of[_key(piece.path)]
            table = load_row_group(snapshot, index, pq_file, piece.row_group, columns)
            runs = keep.get((index, piece.row_group))
            if runs is not None:  # a boundary row group: the other shards' rows are masked
                table = table.filter(pa.array(keep_mask(runs, table.num_rows)))
            return table

    return SnapshotWorker


def _key(path: str) -> str:
    return path.split("://", 1)[-1].rstrip("/")


def _dense_lists(column: pa.Array, spec: FeatureSpec, snapshot: TableSnapshot) -> np.ndarray:
    """A fixed-length list column as a (rows, *shape) array, without a Python loop."""
    import pyarrow.compute as pc

    size = int(np.prod(spec.shape))
    if pa.types.is_fixed_size_list(column.type):
        flat = column.flatten()
    else:
        lengths = column.value_lengths()
        if len(column) and (pc.min(lengths).as_py() != size or pc.max(lengths).as_py() != size):
            where = find_ragged(snapshot, spec.name)  # name the file and row group
            if where:
                raise _ragged_error(spec.name, *where)
            raise DataError(
                f"Column {spec.name!r} of table {snapshot.uri!r} has rows of shape "
                f"({pc.max(lengths)},) where {spec.shape} was expected (the lists differ in "
                "length between row groups). Pad them to one length when writing the table."
            )
        flat = column.flatten()
    if flat.null_count:
        raise DataError(
            f"List column {spec.name!r} of table {snapshot.uri!r} has null elements. Fill them "
            "when writing the table."
        )
    values = flat.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    return values.reshape((len(column), *spec.shape))


def _ragged_error(column, path, rg, lo, hi) -> DataError:
    return DataError(
        f"List column {column!r} has rows of different lengths ({lo} to {hi}) in file "
        f"{path!r}, row group {rg}. A feature needs a fixed shape: pad or truncate the lists "
        "when writing the table, or drop the column."
    )


def _seed(seed) -> int:
    return 0 if seed is None else int(seed)


def _permute(pool: Sequence[dict[str, np.ndarray]], rng: np.random.Generator) -> dict:
    # A row group larger than the buffer is permuted as it is: no concatenation copy.
    merged = (
        pool[0] if len(pool) == 1 else {k: np.concatenate([b[k] for b in pool]) for k in pool[0]}
    )
    order = rng.permutation(num_rows(merged))
    return {k: np.take(v, order, axis=0) for k, v in merged.items()}


def _specs(plan: ColumnPlan) -> list[FeatureSpec]:
    return list(plan.features) + ([plan.label] if plan.label else [])
