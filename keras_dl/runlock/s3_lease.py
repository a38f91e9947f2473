"""The run lock on S3: a lease object, taken and renewed with conditional writes."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time

from keras_dl import storage
from keras_dl.errors import KerasDLError
from keras_dl.runlock.base import Owner, RunLock, RunLockedError
from keras_dl.storage.retry import drop_deadline, hold_deadline, is_transient, retrying

log = logging.getLogger(__name__)

LEASE_FILE = ".lease.json"
LEASE_SECONDS = 60.0
RETRY_BEAT = 1.0  # seconds between renewal attempts while the store does not answer
# The lease's S3 calls give up within seconds on a store that does not answer, so that neither
# the heartbeat nor the release at exit waits on one (the heartbeat simply tries again).
_CLIENT_CONFIG = {
    "connect_timeout": 2,
    "read_timeout": 3,
    "retries": {"max_attempts": 1, "mode": "standard"},
}


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
    While it holds the lease, store calls retried through an outage
    (:mod:`keras_dl.storage.retry`) wait until the lease's expiry and no longer.
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
        self._renewed = True  # the store answered the last renewal

    def acquire(self, run_id: str | None = None) -> None:
        if self._etag is not None:
            return
        owner = self._fresh(Owner.me(run_id))
        try:
            self._etag = retrying(lambda: self._put(owner, IfNoneMatch="*"), self._uri())
        except _Conflict:
            stale, etag = retrying(self._read, self._uri())
            if _same(stale, owner):  # our own create, whose reply the outage lost
                self._etag = etag
            elif stale is not None and (stale.expires or 0) > time.time():
                raise self._locked_error() from None
            else:
                try:  # expired (or unreadable): replace exactly that object, or lose the race
                    self._etag = self._put(
                        owner, **({"IfMatch": etag} if etag else {"IfNoneMatch": "*"})
                    )
                except _Conflict:
                    raise self._locked_error() from None
                who = stale.describe() if stale else "an unreadable owner record"
                log.warning("Took over the expired run lease of %s (%s).", self.run_dir, who)
        self.owner, self.lost, self._renewed = owner, None, True
        self._stop = threading.Event()  # a thread of an earlier hold keeps its own, set
        hold_deadline(self._valid_until)
        self._thread = threading.Thread(target=self._heartbeat, name="keras_dl-lease", daemon=True)
        self._thread.start()

    def update(self, run_id: str) -> None:
        """Record the MLflow run in the lease (renewing it).

        Raises:
            RunLockedError: The lease was taken over: this process no longer holds the run
                directory (it could not renew within ``lease_seconds``).
        """
        if self._etag is not None and self.owner is not None:
            owner = dataclasses.replace(self.owner, run_id=run_id)
            try:
                retrying(lambda: self._renew(owner), self._uri())
            except _Conflict:
                holder = self.holder()
                self.lost = f"the lease {self._uri()} was taken over by {holder}"
                raise RunLockedError(
                    f"This training lost runtime.run_dir={self.run_dir}: its lease "
                    f"{self._uri()} is now held by "
                    f"{holder.describe() if holder else 'another process'}. It was not renewed "
                    f"within runtime.lease_seconds={self.lease_seconds:g} (the store unreachable, "
                    "or this process stalled); raise runtime.lease_seconds, or give this run "
                    "its own directory."
                ) from None

    def holder(self) -> Owner | None:
        return self._read()[0]

    def release(self) -> None:
        """Give the lease up without waiting on the store: the heartbeat is told to stop, not
        joined (it may be inside a call to a store that does not answer), and the lease is
        deleted only when the store answered its last renewal. Otherwise it lapses by itself
        at its expiry."""
        if self._etag is None:
            return
        self._stop.set()
        drop_deadline(self._valid_until)
        if self._guard.acquire(timeout=0.5):  # else the heartbeat is inside a renewal
            try:
                if self.lost is None and self._renewed:  # taken over: another run's now
                    self._client().delete_object(
                        Bucket=self.bucket, Key=self.key, IfMatch=self._etag
                    )
            except Exception as exc:  # taken over meanwhile, or unreachable: it expires anyway
                log.warning("Could not delete the run lease %s (%s).", self._uri(), exc)
            finally:
                self._etag, self.owner, self._thread = None, None, None
                self._guard.release()
        else:
            self._etag, self.owner, self._thread = None, None, None

    def _locked_error(self) -> RunLockedError:
        error = super()._locked_error()
        return RunLockedError(
            f"{error} The lease is the object {self._uri()}: it lapses "
            f"{self.lease_seconds:g} s after its holder stops renewing it, and a run started "
            "after that takes it over."
        )

    # -- internals ---------------------------------------------------------------------------
    def _valid_until(self) -> float | None:
        """Until when the lease stays valid (its expiry as last written); None unless held."""
        owner = self.owner
        return None if owner is None or self.lost is not None else owner.expires

    def _heartbeat(self) -> None:
        stop, beat = self._stop, self.lease_seconds / 3
        while not stop.wait(beat):
            owner = self.owner
            if owner is None:
                return
            try:
                self._renew(owner)
                beat = self.lease_seconds / 3
            except _Conflict:
                self.lost = f"the lease {self._uri()} was taken over by {self.holder()}"
                log.error("Run directory %s: %s.", self.run_dir, self.lost)
                return
            except Exception as exc:  # the store did not answer: try again soon
                if not stop.is_set():
                    log.debug("Could not renew the run lease %s (%s).", self._uri(), exc)
                self._renewed, beat = False, min(RETRY_BEAT, self.lease_seconds / 3)

    def _renew(self, owner: Owner) -> None:
        owner = self._fresh(owner)
        with self._guard:
            current = self._etag
            if current is None:
                return
            try:
                etag = self._put(owner, IfMatch=current)
            except _Conflict:
                stored, etag = self._read()
                if not _same(stored, owner):
                    raise
                # our own write, whose reply a store outage lost
            if self._etag is current:  # not released meanwhile (release does not wait for us)
                self._etag, self.owner, self._renewed = etag, owner, True

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
            if is_transient(exc):
                raise
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
            if is_transient(exc):
                raise
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
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=storage.s3_endpoint(),
        region_name=storage.s3_region(),
        config=Config(**_CLIENT_CONFIG),
    )


def _same(stored: Owner | None, owner: Owner) -> bool:
    """True when the stored record is this holder's (same host, process and start)."""
    return stored is not None and (stored.host, stored.pid, stored.since) == (
        owner.host,
        owner.pid,
        owner.since,
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
