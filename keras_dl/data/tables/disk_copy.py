"""A local-disk copy of a snapshot's files, for tables on remote or slow storage.

Every epoch, every rank of a host and the next run read the same files; copying them once to
local disk (``data.cache_dir``) turns repeated remote reads into local ones. Each file is an
entry of the host's :class:`~keras_dl.data.tables.disk_cache.DiskCache`, keyed by its URI, size
and modification time (a rewritten file is a new entry, never the old copy), bounded by
``data.cache_dir_max_bytes``. A file that does not fit the bound, or whose modification time
the store does not give, is read in place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import replace

from keras_dl.data.tables.disk_cache import DiskCache
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.storage import filesystem

log = logging.getLogger(__name__)


def cache_files(
    snapshot: TableSnapshot, cache_dir: str, max_bytes: int | None = None
) -> TableSnapshot:
    """Copy ``snapshot``'s files into ``cache_dir`` (once per host) and return a snapshot
    reading the copies, the files that do not fit ``max_bytes`` in place.

    The snapshot keeps its URI, version and partitions, so lineage still names the source.

    Raises:
        DataError: When a file cannot be read or the cache folder cannot be written.
    """

    cache = DiskCache(cache_dir, max_bytes)
    files, left = [], []
    for uri in snapshot.files:
        try:
            fs, path = filesystem(uri)
            info = fs.get_file_info(path)
        except Exception as exc:
            raise DataError(f"Cannot stat {uri!r} to cache it in {cache_dir!r}: {exc}") from None
        if info.mtime_ns is None:
            left.append(uri)  # no way to tell a rewritten file from the copy: read in place
            files.append(uri)
            continue
        key = hashlib.sha1(f"{uri}|{info.size}|{info.mtime_ns}".encode()).hexdigest()[:20]

        def fill(target: str, fs=fs, path=path, uri=uri) -> int:
            try:
                with fs.open_input_stream(path) as src, open(target, "r+b") as dst:
                    shutil.copyfileobj(src, dst, length=8 << 20)
                    return dst.tell()
            except OSError as exc:
                raise DataError(f"Caching {uri!r} in {cache_dir!r} failed: {exc}") from None

        local = cache.get(key, os.path.basename(path), info.size, fill)
        if local is None:
            left.append(uri)
        files.append(local or uri)
    if left:
        log.warning(
            "data.cache_dir=%s: %d of %d files read in place (they do not fit "
            "data.cache_dir_max_bytes=%s beside the entries in use, or the store gives no "
            "modification time), e.g. %s",
            cache_dir, len(left), len(files), max_bytes, left[0],
        )  # fmt: skip
    return replace(snapshot, files=tuple(files))
