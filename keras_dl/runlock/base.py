"""The run lock's interface: who holds a run directory, and the error that names them."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from dataclasses import dataclass

from keras_dl.errors import KerasDLError


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
        text = f"host {self.host}, pid {self.pid}, MLflow run {self.run_id or '(not yet created)'}, since {started}"
        if self.expires is not None:
            ends = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.expires))
            text += f", lease valid until {ends} unless renewed"
        return text


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
