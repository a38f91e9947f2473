"""A bounded cache of whole files on local disk, shared by the processes (ranks, runs) of a host.

Layout of the cache folder:

- ``entries/<key>-<name>``: complete copies. An entry appears only by an atomic rename of a
  copy whose length was checked, so a reader never sees half a file.
- ``partial/<key>``: a copy being filled, never read. It is created at its full length first
  (the space is reserved against the bound). A fill killed mid-copy leaves it behind; the next
  fill of that key overwrites it, and an eviction removes it once no process holds its lock.
- ``locks/<key>``: the fill lock of one entry (``flock``): one process fills it, the others
  wait and then find it filled.
- ``pins/<pid>-<n>``: the keys a live process reads, one a line. The process holds ``flock`` on
  its pin file for its life, so a pin file nobody holds is a dead process's, and removed.
- ``cache.lock``: held while an entry is looked up, space reserved, or entries evicted.

With a bound (``max_bytes``), a fill first evicts the least recently used entries (by the
mtime each lookup touches) that no live process has pinned; a file that still does not fit is
not cached (its caller reads it in place). Locks are ``fcntl.flock``: one host, local disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import Callable, Iterator

from keras_dl.errors import DataError

_pin_files: dict[str, _PinFile] = {}  # cache root -> this process's pin file
_pin_count = itertools.count()


class DiskCache:
    """Whole files under ``root``, at most ``max_bytes`` of them (None: no bound)."""

    def __init__(self, root: str, max_bytes: int | None = None):
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        try:
            for sub in ("entries", "partial", "locks", "pins"):
                os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        except OSError as exc:
            raise DataError(
                f"Cannot create the cache folder data.cache_dir={root!r}: {exc}. Point "
                "data.cache_dir at a writable local folder."
            ) from None

    def lookup(self, key: str, name: str, size: int) -> str | None:
        """The local path of entry ``key`` when it is complete (pinned, marked used), else None."""
        entry = os.path.join(self.root, "entries", f"{key}-{name}")
        with self._locked("cache.lock"):
            return entry if self._ready(entry, size, key) else None

    def get(self, key: str, name: str, size: int, fill: Callable[[str], int]) -> str | None:
        """The local path of entry ``key`` (``size`` bytes), filled by ``fill`` when missing.

        ``fill(path)`` writes the copy into the existing file ``path`` (opened ``r+b``) and
        returns the bytes it wrote. The entry is pinned for this process's life. Returns None
        when the entry cannot fit the bound, even after evicting every unpinned entry.

        Raises:
            DataError: When the copy's length is not ``size`` (the source changed while read).
        """
        entry = self.lookup(key, name, size)
        if entry is not None:
            return entry
        entry = os.path.join(self.root, "entries", f"{key}-{name}")
        with self._locked(os.path.join("locks", key)):  # one filler of this entry at a time
            with self._locked("cache.lock"):
                if self._ready(entry, size, key):  # another process filled it meanwhile
                    return entry
                if not self._make_room(size, key):
                    return None
                _pins(self.root).add(key)
                partial = os.path.join(self.root, "partial", key)
                with open(partial, "wb") as f:
                    f.truncate(size)  # reserved: counted against the bound while it fills
            try:
                wrote = fill(partial)
                if wrote != size:
                    raise DataError(
                        f"Caching {name!r} read {wrote} bytes where the store said {size}: the "
                        "file changed while it was copied. Run again."
                    )
                os.replace(partial, entry)  # atomic: complete or absent
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(partial)
                raise
        return entry

    def _ready(self, entry: str, size: int, key: str) -> bool:
        """Whether ``entry`` is complete; if so, pin it and mark it used now."""
        try:
            if os.path.getsize(entry) != size:
                os.remove(entry)  # not ours to serve (a copy made outside this code)
                return False
        except OSError:
            return False
        _pins(self.root).add(key)
        os.utime(entry)
        return True

    def _make_room(self, size: int, key: str) -> bool:
        """Evict unpinned entries, oldest use first, until ``size`` more bytes fit."""
        if self.max_bytes is None:
            return True
        if size > self.max_bytes:
            return False
        used = 0
        partial_dir = os.path.join(self.root, "partial")
        for other in os.listdir(partial_dir):
            path = os.path.join(partial_dir, other)
            if other == key:
                continue  # a killed fill of this entry: overwritten next
            if self._fill_lock_free(other):  # its filler died: nothing will complete it
                with contextlib.suppress(OSError):
                    os.remove(path)
                continue
            with contextlib.suppress(OSError):
                used += os.path.getsize(path)
        entries = []
        for path in self._entry_paths():
            with contextlib.suppress(OSError):
                st = os.stat(path)
                entries.append((st.st_mtime_ns, path, st.st_size))
                used += st.st_size
        if used + size <= self.max_bytes:
            return True
        pinned = self._pinned()
        for _, path, bytes_ in sorted(entries):
            if os.path.basename(path).split("-", 1)[0] in pinned:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                used -= bytes_
            if used + size <= self.max_bytes:
                return True
        return False

    def _entry_paths(self) -> list[str]:
        folder = os.path.join(self.root, "entries")
        return [os.path.join(folder, n) for n in os.listdir(folder)]

    def _fill_lock_free(self, key: str) -> bool:
        try:
            fd = os.open(os.path.join(self.root, "locks", key), os.O_RDWR)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing drops the lock just taken

    def _pinned(self) -> set[str]:
        """Keys pinned by live processes (this one included); dead processes' pins removed."""
        keys: set[str] = set()
        folder = os.path.join(self.root, "pins")
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                os.remove(path)  # nobody holds it: its process is gone
                continue
            except BlockingIOError:
                with os.fdopen(os.dup(fd)) as f:
                    keys.update(line.strip() for line in f if line.strip())
            finally:
                os.close(fd)
        return keys

    @contextlib.contextmanager
    def _locked(self, relative: str) -> Iterator[None]:
        path = os.path.join(self.root, relative)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataError(f"Cannot lock {path!r} in data.cache_dir: {exc}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def cached_copy(path: str) -> bool:
    """Whether ``path`` is an entry of a disk cache (a copy: delete it to have it refilled)."""
    folder = os.path.dirname(path)
    root = os.path.dirname(folder)
    return os.path.basename(folder) == "entries" and os.path.exists(f"{root}/cache.lock")


class _PinFile:
    """This process's pin file in one cache: held (``flock``) for the process's life."""

    def __init__(self, root: str):
        path = os.path.join(root, "pins", f"{os.getpid()}-{next(_pin_count)}")
        self._file = open(path, "a")  # noqa: SIM115 - open for the process's life
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        self._keys: set[str] = set()

    def add(self, key: str) -> None:
        if key not in self._keys:
            self._keys.add(key)
            self._file.write(key + "\n")
            self._file.flush()


def _pins(root: str) -> _PinFile:
    if root not in _pin_files:
        _pin_files[root] = _PinFile(root)
    return _pin_files[root]
