"""A Petastorm ``Reader`` of exactly the row groups a shard's epoch planned, in their order.

Petastorm lists a dataset's row groups and ventilates them to its worker pool. Here it lists
only the planned ones (``petastorm_compat.row_groups.planned``: no footer parsed to list them),
ventilates them in the planned order (:func:`_planned_reader`), and runs keras_dl's row-group
worker (:mod:`~keras_dl.data.stream.row_group_worker`) on a thread pool. Object-store files
are opened through :mod:`keras_dl.storage` (credentials and endpoint from the environment).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from keras_dl.data.petastorm_compat.row_groups import key as _key
from keras_dl.data.petastorm_compat.row_groups import planned
from keras_dl.data.stream.prefetch import RowGroupPrefetch
from keras_dl.data.stream.row_group_worker import (
    Convert,
    LoadAndConvert,
    load_and_convert,
    worker_class,
)
from keras_dl.data.stream.shards import Piece
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError, KerasDLError
from keras_dl.storage import file_url
from keras_dl.storage.retry import retrying

_RESULTS_QUEUE = 4  # row groups Petastorm's pool holds decoded ahead of the reader


def open_reader(
    snapshot: TableSnapshot,
    columns,
    pieces: Sequence[Piece],
    workers: int,
    convert: Convert | None = None,
    prefetch: RowGroupPrefetch | None = None,
    load: LoadAndConvert = load_and_convert,
):
    """A Petastorm ``Reader`` of ``pieces`` (in that order) with keras_dl's row-group worker
    (which publishes :class:`~keras_dl.data.stream.row_group_worker.Converted` results when
    given ``convert``, and decodes the bytes ``prefetch`` fetched, when given); its workers
    hand each row group on through ``load`` (see
    :func:`~keras_dl.data.stream.row_group_worker.worker_class`)."""
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

            def attempt():
                with planned(last):
                    return _planned_reader(order)(
                        fs,
                        paths,
                        worker_class=worker_class(
                            snapshot, tuple(columns), index_of, keep, convert, prefetch, load
                        ),
                        # Thread workers: blocking, strict round-robin results (a seeded read
                        # is reproducible); Petastorm buffers at most _RESULTS_QUEUE row groups.
                        reader_pool=ThreadPool(workers, _RESULTS_QUEUE, shuffle_rows=False),
                        shuffle_rows=False,  # rows are mixed by the shuffle buffer
                        shuffle_row_groups=False,  # the pieces come in the planned (seeded) order
                        num_epochs=1,
                        is_batched_reader=True,
                    )

            # Opening reads the files' metadata (a HEAD each on a store): through an outage.
            return retrying(attempt, snapshot.uri)
        except KerasDLError:  # the store stayed unreachable (StoreUnavailable), a DataError
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
