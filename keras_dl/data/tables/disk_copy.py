"""A local-disk copy of a snapshot's files, for tables on remote or slow storage.

Every epoch and every rank on a host reads the same files; copying them once to local disk
(``data.cache_dir``) turns repeated remote reads into local ones. Files are keyed by their URI,
size and modification time, copied atomically, and reused by later runs while unchanged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace

from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.storage import filesystem


def cache_files(snapshot: TableSnapshot, cache_dir: str) -> TableSnapshot:
    """Copy ``snapshot``'s files into ``cache_dir`` (once) and return a snapshot reading them.

    The snapshot keeps its URI, version and partitions, so lineage still names the source.

    Raises:
        DataError: When a file cannot be read or the cache folder cannot be written.
    """

    os.makedirs(cache_dir, exist_ok=True)
    local = []
    for uri in snapshot.files:
        try:
            fs, path = filesystem(uri)
            info = fs.get_file_info(path)
        except Exception as exc:
            raise DataError(f"Cannot stat {uri!r} to cache it in {cache_dir!r}: {exc}") from None
        mtime = info.mtime_ns if info.mtime_ns is not None else 0
        key = hashlib.sha1(f"{uri}|{info.size}|{mtime}".encode()).hexdigest()[:16]
        target = os.path.join(cache_dir, f"{key}-{os.path.basename(path)}")
        if not (os.path.exists(target) and os.path.getsize(target) == info.size):
            tmp = f"{target}.{os.getpid()}.tmp"
            try:
                with fs.open_input_stream(path) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=8 << 20)
                os.replace(tmp, target)  # atomic: a reader never sees half a file
            except OSError as exc:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise DataError(f"Caching {uri!r} in {cache_dir!r} failed: {exc}") from None
        local.append(target)
    return replace(snapshot, files=tuple(local))
