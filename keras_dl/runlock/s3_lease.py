"""The run lock on S3: a lease object, taken and renewed with conditional writes."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from keras_dl import storage
from keras_dl.errors import KerasDLError
from keras_dl.extras import import_extra
from keras_dl.runlock.base import Owner
from keras_dl.runlock.lease import Lease, LeaseConflict
from keras_dl.storage.retry import is_transient, retrying

log = logging.getLogger(__name__)

LEASE_FILE = ".lease.json"
LEASE_SECONDS = 60.0
# The lease's S3 calls give up within seconds on a store that does not answer, so that neither
# the heartbeat nor the release at exit waits on one (the heartbeat simply tries again).
_CLIENT_CONFIG = {
    "connect_timeout": 2,
    "read_timeout": 3,
    "retries": {"max_attempts": 1, "mode": "standard"},
}


class S3Lease(Lease):
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

    renewal_fix = "raise runtime.lease_seconds, or give this run its own directory"

    def __init__(self, run_dir: str, lease_seconds: float = LEASE_SECONDS):
        super().__init__(run_dir, lease_seconds)
        bucket, _, prefix = self.run_dir.split("://", 1)[1].partition("/")
        self.bucket, self.key = bucket, f"{prefix}/{LEASE_FILE}" if prefix else LEASE_FILE
        self._etag: str | None = None
        self._client_obj = None

    def acquire(self, run_id: str | None = None) -> None:
        if self._etag is not None:
            return
        owner = self._fresh(Owner.me(run_id))
        try:
            self._etag = retrying(lambda: self._put(owner, IfNoneMatch="*"), self._uri())
        except LeaseConflict:
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
                except LeaseConflict:
                    raise self._locked_error() from None
                who = stale.describe() if stale else "an unreadable owner record"
                log.warning("Took over the expired run lease of %s (%s).", self.run_dir, who)
        self._hold(owner)

    def holder(self) -> Owner | None:
        return self._read()[0]

    # -- the store's part --------------------------------------------------------------------
    def _held(self) -> bool:
        return self._etag is not None

    def _delete(self) -> None:
        self._client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self._etag)

    def _forget(self) -> None:
        self._etag = None

    def _describe(self) -> str:
        return f"the object {self._uri()}"

    def _renew(self, owner: Owner) -> None:
        owner = self._fresh(owner)
        with self._guard:
            current = self._etag
            if current is None:
                return
            try:
                etag = self._put(owner, IfMatch=current)
            except LeaseConflict:
                stored, etag = self._read()
                if not _same(stored, owner):
                    raise
                # our own write, whose reply a store outage lost
            if self._etag is current:  # not released meanwhile (release does not wait for us)
                self._etag, self.owner, self._renewed = etag, owner, True

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
                raise LeaseConflict(code) from None
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
        MissingExtra: Naming the extra to install when boto3 is missing.
    """
    boto3 = import_extra("boto3", "A run directory on S3 (its lease is a conditional write)")
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


def _store_error(uri: str, exc: Exception) -> KerasDLError:
    return KerasDLError(
        f"The run lease {uri} cannot be written or read ({exc}). Check that the bucket exists, "
        "AWS_ENDPOINT_URL, AWS_REGION and the credentials (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY or AWS_PROFILE), and that they allow s3:PutObject, "
        "s3:GetObject and s3:DeleteObject under the run directory."
    )
