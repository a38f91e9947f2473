"""One training per run directory: an exclusive lock on ``runtime.run_dir``, held while it runs.

Two trainings in one ``run_dir`` would write the same checkpoints and resume each other's.
:func:`open_run_lock` returns the lock for a directory; ``fit`` (or, under Horovod, the driver)
acquires it before anything is written and releases it when the run ends.

On a local disk the lock is ``fcntl.flock`` on ``run_dir/.lock``. The kernel drops it when its
process ends, however it ends (kill -9 included), so the lock of a dead process is free and the
next run takes it over; the owner record in the file is then just overwritten. Object storage has
no such lock: on S3 (``s3://``) an :class:`S3Lease` (an owner record with an expiry, created with a
conditional write, renewed while the run lives, taken over once expired) implements the same
:class:`RunLock` interface.

Example:
    >>> lock = open_run_lock("runs/digits")      # doctest: +SKIP
    >>> lock.acquire()                           # raises RunLockedError naming the holder
    >>> lock.update(run_id="abc123")             # the MLflow run, once it exists
    >>> lock.release()
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from keras_dl import storage
from keras_dl.errors import KerasDLError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
LEASE_FILE = ".lease.json"
LEASE_SECONDS = 60.0
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
    return bool(held) and held == launcher_key(run_dir)


def launcher_key(run_dir: str | os.PathLike) -> str:
    """How a launcher names the run directory it holds: an absolute path, or the URI as given."""
    text = str(run_dir)
    local = storage.local_path(text)
    return os.path.abspath(local) if local is not None else text.rstrip("/")


def open_run_lock(run_dir: str | os.PathLike, lease_seconds: float = LEASE_SECONDS) -> RunLock:
    """The lock for ``run_dir``: a :class:`FileLock` for a local path, an :class:`S3Lease` for
    ``s3://``.

    Args:
        run_dir: The run directory (a local path or an ``s3://`` URI).
        lease_seconds: How long an S3 lease lasts without renewal; the holder renews it every
            third of that. Defaults to 60.

    Raises:
        KerasDLError: For another URI scheme (``gs://``, ...), which has no lease here.
    """
    text = str(run_dir)
    if storage.local_path(text) is not None:
        return FileLock(storage.local_path(text))
    if text.split("://", 1)[0] in storage.S3_SCHEMES:
        return S3Lease(text, lease_seconds)
    raise KerasDLError(
        f"runtime.run_dir={text} is on an object store keras_dl has no run lease for (only "
        "s3:// and S3-compatible stores). Use an s3:// URI, or a local or mounted directory."
    )


class S3Lease(RunLock):
    """:class:`RunLock` on S3: the lease object ``run_dir/.lease.json`` (host, pid, run id, expiry).

    - **Taking it** is a conditional create (``PutObject`` with ``If-None-Match: *``): of two
      trainings that start together, S3 lets exactly one create the object.
    - **Holding it**: a daemon thread renews the expiry every ``lease_seconds / 3`` with a write
      conditional on the object being the one this process wrote last (``If-Match`` its ETag).
    - **A dead holder's lease** (kill -9, a lost node) is taken over once expired, again with
      ``If-Match`` on the stale object's ETag, so two takers cannot both win.
    - **Releasing** deletes the object if it is still ours (``If-Match``).

    The expiry is the holder's wall-clock time: hosts' clocks must agree to within a small part
    of ``lease_seconds``. A holder that cannot renew (the store unreachable for longer than the
    lease) loses it; this is logged as an error, and another run may then take the directory.
    Needs ``boto3`` (pyarrow's S3 filesystem has no conditional writes).

    Args:
        run_dir: The ``s3://bucket/prefix`` run directory.
        lease_seconds: Validity of the lease without renewal. Defaults to 60.
    """

    def __init__(self, run_dir: str, lease_seconds: float = LEASE_SECONDS):
        super().__init__(run_dir.rstrip("/"))
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}.")
        bucket, _, prefix = self.run_dir.split("://", 1)[1].partition("/")
        self.bucket, self.key = bucket, f"{prefix}/{LEASE_FILE}" if prefix else LEASE_FILE
        self.lease_seconds = float(lease_seconds)
        self.lost: str | None = None  # why the lease was lost while held, if it was
        self._etag: str | None = None
        self._client_obj = None
        self._guard = threading.Lock()  # one conditional write at a time (heartbeat vs update)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, run_id: str | None = None) -> None:
        if self._etag is not None:
            return
        owner = self._fresh(Owner.me(run_id))
        try:
            self._etag = self._put(owner, IfNoneMatch="*")
        except _Conflict:
            stale, etag = self._read()
            if stale is not None and (stale.expires or 0) > time.time():
                raise self._locked_error() from None
            try:  # expired (or unreadable): replace exactly that object, or lose the race
                self._etag = self._put(
                    owner, **({"IfMatch": etag} if etag else {"IfNoneMatch": "*"})
                )
            except _Conflict:
                raise self._locked_error() from None
            who = stale.describe() if stale else "an unreadable owner record"
            log.warning("Took over the expired run lease of %s (%s).", self.run_dir, who)
        self.owner, self.lost = owner, None
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name="keras_dl-lease", daemon=True)
        self._thread.start()

    def update(self, run_id: str) -> None:
        if self._etag is not None and self.owner is not None:
            self._renew(dataclasses.replace(self.owner, run_id=run_id))

    def holder(self) -> Owner | None:
        return self._read()[0]

    def release(self) -> None:
        if self._etag is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._guard:
            try:
                self._client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self._etag)
            except Exception as exc:  # taken over meanwhile, or unreachable: it expires anyway
                log.warning("Could not delete the run lease %s (%s).", self._uri(), exc)
            self._etag, self.owner, self._thread = None, None, None

    def _locked_error(self) -> RunLockedError:
        error = super()._locked_error()
        return RunLockedError(
            f"{error} The lease is the object {self._uri()}: it lapses "
            f"{self.lease_seconds:g} s after its holder stops renewing it, and a run started "
            "after that takes it over."
        )

    # -- internals ---------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            owner = self.owner
            if owner is None:
                return
            try:
                self._renew(owner)
            except _Conflict:
                self.lost = f"the lease {self._uri()} was taken over by {self.holder()}"
                log.error("Run directory %s: %s.", self.run_dir, self.lost)
                return
            except Exception as exc:  # a transient store error: retried at the next beat
                log.warning("Could not renew the run lease %s (%s).", self._uri(), exc)

    def _renew(self, owner: Owner) -> None:
        owner = self._fresh(owner)
        with self._guard:
            if self._etag is None:
                return
            self._etag = self._put(owner, IfMatch=self._etag)
            self.owner = owner

    def _fresh(self, owner: Owner) -> Owner:
        return dataclasses.replace(owner, expires=time.time() + self.lease_seconds)

    def _put(self, owner: Owner, **condition) -> str:
        from botocore.exceptions import ClientError

        body = json.dumps(dataclasses.asdict(owner)).encode()
        try:
            reply = self._client().put_object(
                Bucket=self.bucket, Key=self.key, Body=body, **condition
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise _Conflict(code) from None
            raise _store_error(self._uri(), exc) from None
        return reply["ETag"]

    def _read(self) -> tuple[Owner | None, str | None]:
        """The stored owner record and its ETag; (None, None) when there is none."""
        from botocore.exceptions import ClientError

        try:
            reply = self._client().get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            raise _store_error(self._uri(), exc) from None
        etag = reply["ETag"]
        try:
            return Owner(**json.loads(reply["Body"].read())), etag
        except (ValueError, TypeError):
            return None, etag

    def _client(self):
        if self._client_obj is None:
            self._client_obj = s3_client()
        return self._client_obj

    def _uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def s3_client():
    """A boto3 S3 client from the standard AWS environment (endpoint and region included).

    Raises:
        ImportError: Naming the package to install when boto3 is missing.
    """
    try:
        import boto3
    except ImportError:
        raise ImportError(
            "A run directory on S3 needs boto3 for its lease (conditional writes): "
            "pip install boto3"
        ) from None
    env = os.environ
    return boto3.client(
        "s3",
        endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
    )


class _Conflict(Exception):
    """A conditional write lost: the object is not (or no longer) what the condition said."""


def _store_error(uri: str, exc: Exception) -> KerasDLError:
    return KerasDLError(
        f"The run lease {uri} cannot be written or read ({exc}). Check that the bucket exists, "
        "AWS_ENDPOINT_URL, AWS_REGION and the credentials (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY or AWS_PROFILE), and that they allow s3:PutObject, "
        "s3:GetObject and s3:DeleteObject under the run directory."
    )
