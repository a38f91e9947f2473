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

log = logging.getLogger(__name__)

LEASE_FILE = ".lease.json"
LEASE_SECONDS = 60.0


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
        """Record the MLflow run in the lease (renewing it).

        Raises:
            RunLockedError: The lease was taken over: this process no longer holds the run
                directory (it could not renew within ``lease_seconds``).
        """
        if self._etag is not None and self.owner is not None:
            try:
                self._renew(dataclasses.replace(self.owner, run_id=run_id))
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
        if self._etag is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._guard:
            try:
                if self.lost is None:  # a lease taken over is another run's now: left alone
                    self._client().delete_object(
                        Bucket=self.bucket, Key=self.key, IfMatch=self._etag
                    )
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
    return boto3.client("s3", endpoint_url=storage.s3_endpoint(), region_name=storage.s3_region())


class _Conflict(Exception):
    """A conditional write lost: the object is not (or no longer) what the condition said."""


def _store_error(uri: str, exc: Exception) -> KerasDLError:
    return KerasDLError(
        f"The run lease {uri} cannot be written or read ({exc}). Check that the bucket exists, "
        "AWS_ENDPOINT_URL, AWS_REGION and the credentials (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY or AWS_PROFILE), and that they allow s3:PutObject, "
        "s3:GetObject and s3:DeleteObject under the run directory."
    )
