"""Where decoded MDS shards are kept, and when they go.

Each dataset version is decoded once into its own folder under the cache root
(``$KERAS_DL_MDS_CACHE``, else ``~/.cache/keras-dl/mds``, beside keras-dl's other caches). Every
open stamps its folder's ``.last-used``; a folder no open has used for
``$KERAS_DL_MDS_CACHE_DAYS`` days (7 by default) is deleted at the next open of any dataset, so
the copies of versions no run reads any more do not pile up. A job that reads one version for
longer than that without reopening it should raise the number of days.

The copies earlier releases kept under ``~/.cache/keras_dl/mds`` are deleted at the first open
that uses the default root.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

log = logging.getLogger(__name__)

CACHE_ENV = "KERAS_DL_MDS_CACHE"
DAYS_ENV = "KERAS_DL_MDS_CACHE_DAYS"
STAMP = ".last-used"
_OLD_DEFAULT = "~/.cache/keras_dl/mds"  # the spelling before keras-dl's own


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
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, STAMP), "a"):
        pass
    os.utime(os.path.join(folder, STAMP))
    return folder


def _max_age_days() -> float:
    raw = os.environ.get(DAYS_ENV, "7")
    try:
        days = float(raw)
    except ValueError:
        from keras_dl.errors import ConfigError

        raise ConfigError(
            f"{DAYS_ENV}={raw!r} is not a number of days: set it to how long a decoded MDS "
            "version unused by any run is kept (7 by default)."
        ) from None
    return days


def _evict_unused(root: str, keep: str) -> None:
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    days = _max_age_days()
    cutoff = time.time() - days * 86400.0
    for name in names:
        folder = os.path.join(root, name)
        if name == keep or not os.path.isdir(folder):
            continue
        stamp = os.path.join(folder, STAMP)
        try:
            used = os.stat(stamp if os.path.exists(stamp) else folder).st_mtime
        except FileNotFoundError:
            continue  # another process deleted it
        if used < cutoff:
            log.info("Deleting decoded MDS copy %s: unused for over %g days.", folder, days)
            shutil.rmtree(folder, ignore_errors=True)


def _drop_old_default() -> None:
    old = os.path.expanduser(_OLD_DEFAULT)
    if os.path.isdir(old):
        log.info("Deleting the decoded MDS copies of earlier releases in %s.", old)
        shutil.rmtree(old, ignore_errors=True)
