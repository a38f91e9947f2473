"""One training per run directory: an exclusive lock on ``runtime.run_dir``, held while it runs.

Two trainings in one ``run_dir`` would write the same checkpoints and resume each other's.
:func:`open_run_lock` returns the lock for a directory; ``fit`` (or, under Horovod, the driver)
acquires it before anything is written and releases it when the run ends.

On a local disk the lock is ``fcntl.flock`` on ``run_dir/.lock``. The kernel drops it when its
process ends, however it ends (kill -9 included), so the lock of a dead process is free and the
next run takes it over; the owner record in the file is then just overwritten. Object storage has
no such lock: there a lease (an owner record with an expiry, renewed while the run lives, taken
over once expired) implements the same :class:`RunLock` interface.

Example:
    >>> lock = open_run_lock("runs/digits")      # doctest: +SKIP
    >>> lock.acquire()                           # raises RunLockedError naming the holder
    >>> lock.update(run_id="abc123")             # the MLflow run, once it exists
    >>> lock.release()
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from keras_dl.errors import KerasDLError

LOCK_FILE = ".lock"
# Set by a launcher that holds the lock for its ranks (the Horovod driver): the run directory.
HELD_BY_LAUNCHER = "KERAS_DL_RUN_DIR_LOCKED"


class RunLockedError(KerasDLError):
    """Another training holds the run directory."""


@dataclass(frozen=True)
class Owner:
    """Who holds a run directory.

    Args:
        host: Host name of the holding process.
        pid: Its process id.
        run_id: Its MLflow run, once created. Defaults to None.
        since: When it took the lock (seconds since the epoch). Defaults to now.
        expires: When a lease lapses unless renewed; None for a lock the OS releases with its
            process. Defaults to None.
    """

    host: str
    pid: int
    run_id: str | None = None
    since: float = dataclasses.field(default_factory=time.time)
    expires: float | None = None

    @classmethod
    def me(cls, run_id: str | None = None) -> Owner:
        """This process."""
        return cls(host=socket.gethostname(), pid=os.getpid(), run_id=run_id)

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}, MLflow run {self.run_id or '(not yet created)'}, since {started}"


class RunLock:
    """The interface of a run-directory lock (a local file lock, or an object-store lease).

    Args:
        run_dir: The directory the lock guards.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = str(run_dir)
        self.owner: Owner | None = None  # set while this process holds it

    def acquire(self, run_id: str | None = None) -> None:
        """Take the lock now or raise :class:`RunLockedError` naming the holder."""
        raise NotImplementedError

    def update(self, run_id: str) -> None:
        """Record the MLflow run in the owner record (a lease also renews its expiry here)."""
        raise NotImplementedError

    def holder(self) -> Owner | None:
        """The owner record as stored (None when there is none or it is unreadable)."""
        raise NotImplementedError

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _locked_error(self) -> RunLockedError:
        holder = self.holder()
        who = holder.describe() if holder else "an unknown process (its owner record is unreadable)"
        return RunLockedError(
            f"runtime.run_dir={self.run_dir} is in use by another training: {who}. Wait for it "
            "to end or stop it, or give this run its own directory with --set "
            "runtime.run_dir=runs/NAME."
        )


class FileLock(RunLock):
    """:class:`RunLock` as ``fcntl.flock`` on ``run_dir/.lock`` (local disks only: flock is not
    reliable on NFS, and object stores have no locks)."""

    def __init__(self, run_dir: str | os.PathLike):
        super().__init__(run_dir)
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, run_id: str | None = None) -> None:
        import fcntl

        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # No O_TRUNC: the holder's record must stay readable until we hold the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._locked_error() from None
        self._fd = fd
        self._write(Owner.me(run_id))  # replaces a dead holder's stale record

    def update(self, run_id: str) -> None:
        if self._fd is not None and self.owner is not None:
            self._write(dataclasses.replace(self.owner, run_id=run_id))

    def holder(self) -> Owner | None:
        try:
            return Owner(**json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def release(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd, self.owner = None, None

    def _write(self, owner: Owner) -> None:
        data = json.dumps(dataclasses.asdict(owner)).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)
        self.owner = owner


def held_by_launcher(run_dir: str | os.PathLike) -> bool:
    """True in a rank whose launcher holds ``run_dir``'s lock for the whole job."""
    held = os.environ.get(HELD_BY_LAUNCHER)
    return bool(held) and os.path.abspath(held) == os.path.abspath(str(run_dir))


def open_run_lock(run_dir: str | os.PathLike) -> RunLock:
    """The lock for ``run_dir``: a :class:`FileLock` for a local path.

    Raises:
        RunLockedError: Never here; :meth:`RunLock.acquire` raises it.
        KerasDLError: For a URI (``s3://``, ``gs://``, ...): run directories on object storage
            need a lease, which is not implemented yet.
    """
    text = str(run_dir)
    if "://" in text and not text.startswith("file://"):
        raise KerasDLError(
            f"runtime.run_dir={text} is on object storage, where a run needs a lease, which "
            "keras_dl does not implement yet. Use a local or mounted directory."
        )
    return FileLock(text.removeprefix("file://"))
