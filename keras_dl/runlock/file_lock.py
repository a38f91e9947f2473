"""The run lock on a local disk: ``fcntl.flock`` on ``run_dir/.lock``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from keras_dl.runlock.base import Owner, RunLock
from keras_dl.storage import disk_full_is_run_error

LOCK_FILE = ".lock"


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
        try:
            self._write(Owner.me(run_id))  # replaces a dead holder's stale record
        except BaseException:
            self.release()  # a full disk: not held, as no run will end to release it
            raise

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
        with disk_full_is_run_error(str(self.path.parent), LOCK_FILE, len(data)):
            # Over the old record, then cut to length: the blocks a rerun's lock file already
            # has are reused, so retaking the lock needs no free space on a full disk.
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
            os.fsync(self._fd)
        self.owner = owner
