"""Where decoded MDS shards are kept, and when they go.

Each dataset version is decoded once into its own folder under the cache root
(``$KERAS_DL_MDS_CACHE``, else ``~/.cache/keras-dl/mds``, beside keras-dl's other caches). Every
open stamps its folder's ``.last-used``; a folder no open has used for
``$KERAS_DL_MDS_CACHE_DAYS`` days (7 by default) is deleted at the next open of any dataset, so
the copies of versions no run reads any more do not pile up. With ``$KERAS_DL_MDS_CACHE_GB`` set
(no bound by default), each open also deletes the least recently used copies until the root
holds at most that many gigabytes (10^9 bytes), the opened version and the copies in use counted
but never deleted: a root whose copies in use exceed the bound stays over it, and says so.

A copy in use is never deleted, however old its stamp: each process that opened a version holds a
shared ``flock`` on its folder until it exits, and eviction takes the lock exclusively without
waiting (a folder it cannot lock is in use and kept), checks the stamp again under it, renames the
folder aside (``.evicted-*``, atomic) and only then deletes it. An open that waited on an
eviction finds its folder gone and makes it anew; shards are written to a temporary file and
renamed (:func:`keras_dl.data.tables.mds._write`), so ranks decoding the same version never
read half a file. On a file system without ``flock`` the copies are judged by their stamps alone.

The copies earlier releases kept under ``~/.cache/keras_dl/mds`` are deleted at the first open
that uses the default root.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import time
import uuid

log = logging.getLogger(__name__)

CACHE_ENV = "KERAS_DL_MDS_CACHE"
DAYS_ENV = "KERAS_DL_MDS_CACHE_DAYS"
SIZE_ENV = "KERAS_DL_MDS_CACHE_GB"
STAMP = ".last-used"
_OLD_DEFAULT = "~/.cache/keras_dl/mds"  # the spelling before keras-dl's own
EVICTED = ".evicted-"  # a folder renamed aside for deletion: no open reaches it any more
# Folder -> a descriptor of it, shared-locked for as long as this process lives: the versions
# this process opened (and may still read) are never evicted by another.
_HELD: dict[str, int] = {}


def cache_root() -> str:
    """The folder decoded shards go to."""
    return os.environ.get(CACHE_ENV) or os.path.expanduser("~/.cache/keras-dl/mds")


def use(root: str, key: str) -> str:
    """The folder of version ``key`` under ``root``, created and stamped as used now; the
    folders unused for the configured days are deleted first."""
    if root == cache_root() and not os.environ.get(CACHE_ENV):
        _drop_old_default()
    _evict_unused(root, keep=key)
    folder = os.path.join(root, key)
    _hold(folder)
    with open(os.path.join(folder, STAMP), "a"):
        pass
    os.utime(os.path.join(folder, STAMP))
    return folder


def release(folder: str) -> None:
    """Stop holding ``folder`` (its copy may be evicted once its stamp is old)."""
    fd = _HELD.pop(folder, None)
    if fd is not None:
        os.close(fd)


def _hold(folder: str) -> None:
    """Create ``folder`` if needed and hold a shared lock on it; a folder an eviction renamed
    aside while this waited for the lock is made anew."""
    fd = _HELD.get(folder)
    if fd is not None and _same(fd, folder):
        return
    release(folder)
    while True:
        os.makedirs(folder, exist_ok=True)
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue  # evicted between the two calls
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while an eviction holds it
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(fd)
                raise
            log.debug("No flock on %s (%s): copies are judged by their stamps.", folder, exc)
        if _same(fd, folder):
            _HELD[folder] = fd
            return
        os.close(fd)  # renamed aside under us: the path is gone or a new folder


def _same(fd: int, path: str) -> bool:
    """Whether ``path`` is still the folder ``fd`` was opened on."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _max_age_days() -> float:
    return _number(
        DAYS_ENV,
        "7",
        "a number of days: set it to how long a decoded MDS version "
        "unused by any run is kept (7 by default)",
    )


def _max_bytes() -> float | None:
    """``$KERAS_DL_MDS_CACHE_GB`` in bytes; None when unset (no bound on size)."""
    if not os.environ.get(SIZE_ENV):
        return None
    return 1e9 * _number(
        SIZE_ENV,
        "",
        "a number of gigabytes: set it to how much disk the "
        "decoded MDS copies may take (unset: no bound), or unset it",
    )


def _number(name: str, default: str, what: str) -> float:
    raw = os.environ.get(name) or default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        from keras_dl.errors import ConfigError

        raise ConfigError(f"{name}={raw!r} is not {what}.") from None
    return value


def _evict_unused(root: str, keep: str) -> None:
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    days = _max_age_days()
    cutoff = time.time() - days * 86400.0
    for name in names:
        folder = os.path.join(root, name)
        if name.startswith(EVICTED):
            shutil.rmtree(folder, ignore_errors=True)  # left by an eviction that died
            continue
        if name == keep or name.startswith(".") or not os.path.isdir(folder):
            continue
        if _last_used(folder) >= cutoff:
            continue
        _evict(root, folder, cutoff, f"unused for over {days:g} days")
    limit = _max_bytes()
    if limit is not None:
        _evict_to_size(root, keep, limit)


def _evict_to_size(root: str, keep: str, limit: float) -> None:
    """Delete the least recently used copies not in use until ``root`` holds at most ``limit``
    bytes; ``keep`` (the version being opened) counts but is never deleted."""
    copies = []
    for name in os.listdir(root):
        folder = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(folder):
            continue
        copies.append((_last_used(folder), _size(folder), name))
    total = sum(size for _, size, _ in copies)
    for used, size, name in sorted(copies):
        if total <= limit:
            return
        if name == keep:
            continue
        # Stamped since this look (an open is using it): not least recently used any more.
        if _evict(root, os.path.join(root, name), used + 1e-6, f"over {SIZE_ENV}"):
            total -= size
    if total > limit:
        log.warning(
            "The decoded MDS copies in %s take %.3g GB, over %s=%g: the rest are in use "
            "(this version, or held by a live process). Raise %s or point %s at a larger disk.",
            root,
            total / 1e9,
            SIZE_ENV,
            limit / 1e9,
            SIZE_ENV,
            CACHE_ENV,
        )


def _size(folder: str) -> int:
    """Bytes of the files under ``folder`` (0 for a file that went meanwhile)."""
    total = 0
    for top, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(top, f)).st_size
            except FileNotFoundError:
                pass
    return total


def _last_used(folder: str) -> float:
    """When an open last stamped ``folder`` (its own mtime without a stamp); now if it is gone."""
    stamp = os.path.join(folder, STAMP)
    for path in (stamp, folder):
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            continue
    return time.time()  # another process deleted it


def _evict(root: str, folder: str, cutoff: float, why: str) -> bool:
    """Delete ``folder`` unless a process holds it or an open stamped it at or after ``cutoff``
    meanwhile; whether it was deleted."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False  # gone, or not ours to read
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # in use: a live process opened this version
        except OSError:
            pass  # no flock here: the stamp alone decides
        if not _same(fd, folder) or _last_used(folder) >= cutoff:
            return False  # evicted by another process, or used since the first look
        aside = os.path.join(root, f"{EVICTED}{os.path.basename(folder)}-{uuid.uuid4().hex}")
        try:
            os.rename(folder, aside)  # atomic: from now on no open finds it
        except OSError:
            return False
    finally:
        os.close(fd)
    log.info("Deleting decoded MDS copy %s: %s.", folder, why)
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _drop_old_default() -> None:
    old = os.path.expanduser(_OLD_DEFAULT)
    if os.path.isdir(old):
        log.info("Deleting the decoded MDS copies of earlier releases in %s.", old)
        shutil.rmtree(old, ignore_errors=True)
