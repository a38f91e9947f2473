"""One training per run directory: an exclusive lock on ``runtime.run_dir``, held while it runs.

Two trainings in one ``run_dir`` would write the same checkpoints and resume each other's.
:func:`open_run_lock` returns the lock for a directory; ``fit`` (or, under Horovod, the driver)
acquires it before anything is written and releases it when the run ends.

On a local disk the lock is ``fcntl.flock`` on ``run_dir/.lock``. The kernel drops it when its
process ends, however it ends (kill -9 included), so the lock of a dead process is free and the
next run takes it over; the owner record in the file is then just overwritten. Object storage has
no such lock: on S3 (``s3://``) an :class:`S3Lease` (an owner record with an expiry, created with a
conditional write, renewed while the run lives, taken over once expired) implements the same
:class:`RunLock` interface, and on Azure (``abfs://``, ``abfss://``) an :class:`AzureLease` (a
native blob lease on the owner record, renewed while the run lives, expiring on the store's clock).

Modules: :mod:`~keras_dl.runlock.base` (the interface), :mod:`~keras_dl.runlock.file_lock`,
:mod:`~keras_dl.runlock.s3_lease`, :mod:`~keras_dl.runlock.azure_lease`.

Example:
    >>> lock = open_run_lock("runs/digits")      # doctest: +SKIP
    >>> lock.acquire()                           # raises RunLockedError naming the holder
    >>> lock.update(run_id="abc123")             # the MLflow run, once it exists
    >>> lock.release()
"""

from __future__ import annotations

import os

from keras_dl import storage
from keras_dl.errors import KerasDLError
from keras_dl.runlock.azure_lease import AzureLease
from keras_dl.runlock.base import Owner, RunLock, RunLockedError
from keras_dl.runlock.file_lock import LOCK_FILE, FileLock
from keras_dl.runlock.s3_lease import LEASE_FILE, LEASE_SECONDS, S3Lease

__all__ = [
    "AzureLease",
    "HELD_BY_LAUNCHER",
    "LEASE_FILE",
    "LOCK_FILE",
    "FileLock",
    "Owner",
    "RunLock",
    "RunLockedError",
    "S3Lease",
    "held_by_launcher",
    "launcher_key",
    "open_run_lock",
]

# Set by a launcher that holds the lock for its ranks (the Horovod driver): the run directory.
HELD_BY_LAUNCHER = "KERAS_DL_RUN_DIR_LOCKED"


def held_by_launcher(run_dir: str | os.PathLike) -> bool:
    """True in a rank whose launcher holds ``run_dir``'s lock for the whole job."""
    held = os.environ.get(HELD_BY_LAUNCHER)
    return bool(held) and held == launcher_key(run_dir)


def launcher_key(run_dir: str | os.PathLike) -> str:
    """How a launcher names the run directory it holds: an absolute path, or the URI as given."""
    text = str(run_dir)
    local = storage.local_path(text)
    return os.path.abspath(local) if local is not None else text.rstrip("/")


def open_run_lock(run_dir: str | os.PathLike, lease_seconds: float = LEASE_SECONDS) -> RunLock:
    """The lock for ``run_dir``: a :class:`FileLock` for a local path, an :class:`S3Lease` for
    ``s3://``, an :class:`AzureLease` for ``abfs://`` and ``abfss://``.

    Args:
        run_dir: The run directory (a local path, an ``s3://`` or an ``abfs[s]://`` URI).
        lease_seconds: How long a lease lasts without renewal; the holder renews it every
            third of that. Azure's blob leases take 15 to 60 s (clamped). Defaults to 60.

    Raises:
        KerasDLError: For another URI scheme (``gs://``, ...), which has no lease here.
    """
    text = str(run_dir)
    if storage.local_path(text) is not None:
        return FileLock(storage.local_path(text))
    if text.split("://", 1)[0] in storage.S3_SCHEMES:
        return S3Lease(text, lease_seconds)
    if storage.is_azure(text):
        return AzureLease(text, lease_seconds)
    raise KerasDLError(
        f"runtime.run_dir={text} is on an object store keras_dl has no run lease for (only "
        "s3:// and S3-compatible stores, and Azure's abfs:// and abfss://). Use one of those, "
        "or a local or mounted directory."
    )
