"""A local-disk copy of a snapshot's files, for tables on remote or slow storage.

Every epoch, every rank of a host and the next run read the same files; copying them once to
local disk (``data.cache_dir``) turns repeated remote reads into local ones. Each file is an
entry of the host's :class:`~keras_dl.data.tables.disk_cache.DiskCache`, keyed by its URI, size
and modification time (a rewritten file is a new entry, never the old copy), bounded by
``data.cache_dir_max_bytes``. A file that does not fit the bound, or whose modification time
the store does not give, is read in place.

The files not yet cached are copied by a background thread while the first epoch streams them
from the store; each epoch reads the copies complete by its start
(:meth:`~keras_dl.data.tables.snapshot.TableSnapshot.with_local_copies`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from dataclasses import dataclass, replace

from keras_dl.data.tables.disk_cache import DiskCache
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError, KerasDLError
from keras_dl.storage import filesystem
from keras_dl.storage.retry import retrying

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _File:
    uri: str
    key: str
    name: str
    size: int


def cache_files(
    snapshot: TableSnapshot, cache_dir: str, max_bytes: int | None = None, background=True
) -> TableSnapshot:
    """A snapshot reading ``snapshot``'s files from their copies in ``cache_dir``.

    Files already cached are read from there at once; the others are copied (once per host),
    by a background thread unless ``background`` is False, and read from the store until their
    copy is complete. Files that do not fit ``max_bytes`` stay on the store. The snapshot keeps
    its URI, version and partitions, so lineage still names the source.

    Raises:
        DataError: When a file cannot be stat'ed, the cache folder cannot be written, or (not in
            the background) a file cannot be copied.
    """
    cache = DiskCache(cache_dir, max_bytes)
    files, missing, in_place = [], [], []
    for uri in snapshot.files:
        f = _describe(uri, cache_dir)
        local = None if f is None else cache.lookup(f.key, f.name, f.size)
        if f is None:
            in_place.append(uri)
        elif local is None:
            missing.append(f)
        files.append(local or uri)
    copies = LocalCopies(cache, missing, cache_dir)
    if missing and not background:
        copies.fill()
        files = list(copies.resolve(tuple(files)))
    elif missing:
        copies.start()
    if in_place:
        log.warning(
            "data.cache_dir=%s: %d of %d files read in place (the store gives no "
            "modification time to tell a rewritten file from its copy), e.g. %s",
            cache_dir, len(in_place), len(files), in_place[0],
        )  # fmt: skip
    copies_left = copies if missing and background else None
    return replace(snapshot, files=tuple(files), local_copies=copies_left)


class LocalCopies:
    """Copies ``missing`` files into ``cache``; ``resolve`` swaps in the complete ones."""

    def __init__(self, cache: DiskCache, missing: list[_File], cache_dir: str):
        self.cache, self.missing, self.cache_dir = cache, missing, cache_dir
        self._done: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._background, name="keras_dl-cache-fill")
        self._thread.daemon = True  # a copy cut short at exit leaves only a partial file
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background copies; whether they are all done."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def resolve(self, files: tuple[str, ...]) -> tuple[str, ...]:
        done = dict(self._done)  # a snapshot of it: the filler thread adds entries
        return tuple(done.get(f, f) for f in files)

    def fill(self) -> None:
        """Copy every missing file (those that do not fit the bound stay on the store)."""
        left = []
        for f in self.missing:
            local = self.cache.get(f.key, f.name, f.size, self._copier(f))
            if local is None:
                left.append(f.uri)
            else:
                self._done[f.uri] = local
        if left:
            log.warning(
                "data.cache_dir=%s: %d of %d files read from the store: they do not fit "
                "data.cache_dir_max_bytes=%s beside the entries in use, e.g. %s",
                self.cache_dir, len(left), len(self.missing), self.cache.max_bytes, left[0],
            )  # fmt: skip

    def _background(self) -> None:
        try:
            self.fill()
        except Exception as exc:  # the reads go on from the store: they do not need the copy
            self.errors.append(exc)
            log.warning("data.cache_dir=%s: filling the cache stopped: %s", self.cache_dir, exc)

    def _copier(self, f: _File):
        def once(target: str) -> int:
            fs, path = filesystem(f.uri)
            with fs.open_input_stream(path) as src, open(target, "r+b") as dst:
                shutil.copyfileobj(src, dst, length=8 << 20)  # from the start each attempt
                return dst.tell()

        def copy(target: str) -> int:
            try:
                return retrying(lambda: once(target), f.uri)  # through a store outage
            except KerasDLError:  # the store stayed unreachable (StoreUnavailable)
                raise
            except OSError as exc:
                raise DataError(f"Caching {f.uri!r} in {self.cache_dir!r} failed: {exc}") from None

        return copy


def _describe(uri: str, cache_dir: str) -> _File | None:
    """The cache entry of ``uri``, or None when the store gives no modification time."""
    try:
        fs, path = filesystem(uri)
        info = retrying(lambda: fs.get_file_info(path), uri)
    except KerasDLError:
        raise
    except Exception as exc:
        raise DataError(f"Cannot stat {uri!r} to cache it in {cache_dir!r}: {exc}") from None
    if info.mtime_ns is None:
        return None
    key = hashlib.sha1(f"{uri}|{info.size}|{info.mtime_ns}".encode()).hexdigest()[:20]
    return _File(uri, key, os.path.basename(path), info.size)
