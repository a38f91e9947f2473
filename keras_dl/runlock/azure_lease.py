"""The run lock on Azure Blob storage: a native blob lease on the owner record."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid

from keras_dl.errors import KerasDLError
from keras_dl.extras import import_extra
from keras_dl.runlock.base import Owner
from keras_dl.runlock.lease import Lease, LeaseConflict
from keras_dl.storage import azure
from keras_dl.storage.retry import is_transient, retrying

log = logging.getLogger(__name__)

LEASE_FILE = ".lease.json"
MIN_SECONDS, MAX_SECONDS = 15, 60  # the blob lease durations Azure accepts
# The lease's calls give up within seconds on a store that does not answer, so that neither the
# heartbeat nor the release at exit waits on one (the heartbeat simply tries again).
_CLIENT_OPTIONS = {"connection_timeout": 2, "read_timeout": 3, "retry_total": 0}


class AzureLease(Lease):
    """:class:`RunLock` on Azure: a blob lease on ``run_dir/.lease.json`` (the owner record).

    - **Taking it**: the record blob is created if absent, then leased (Azure's *Acquire
      Lease*, with a lease id this process chose). The store grants one lease at a time, so of
      two trainings that start together exactly one gets it; a retried acquire with the same id
      is idempotent, so a reply lost in an outage does not lock this process out.
    - **Holding it**: a daemon thread renews the lease every third of its duration and rewrites
      the record's expiry; the record is written only with the lease id.
    - **A dead holder's lease** (kill -9, a lost node) expires on the store's own clock, with no
      reliance on hosts' clocks, and the next run acquires it.
    - **Releasing** deletes the record with the lease id, which ends the lease.

    Azure leases last 15 to 60 s: ``lease_seconds`` is clamped to that range. A holder that
    cannot renew (the store unreachable for longer than the lease) may lose it to another run;
    this is logged as an error, and its next :meth:`update` raises. While it holds the lease,
    store calls retried through an outage (:mod:`keras_dl.storage.retry`) wait until the
    lease's expiry and no longer. Needs ``azure-storage-blob``.

    Args:
        run_dir: The ``abfs[s]://container@account.dfs.core.windows.net/prefix`` run directory.
        lease_seconds: Validity of the lease without renewal (15 to 60). Defaults to 60.
    """

    def __init__(self, run_dir: str, lease_seconds: float = MAX_SECONDS):
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}.")
        super().__init__(run_dir, min(max(round(lease_seconds), MIN_SECONDS), MAX_SECONDS))
        # Before anything is asked of the store: every method imports azure.core's errors.
        import_extra("azure.storage.blob", "An abfs:// run directory (its lease is a blob lease)")
        self.container, _, prefix = azure.split_uri(self.run_dir)
        self.blob = f"{prefix}/{LEASE_FILE}" if prefix else LEASE_FILE
        self._lease = None  # the BlobLeaseClient while held
        self._client_obj = None

    def acquire(self, run_id: str | None = None) -> None:
        if self._lease is not None:
            return
        lease_id = str(uuid.uuid4())
        try:
            lease = retrying(lambda: self._take(lease_id), self._uri())
        except LeaseConflict:
            raise self._locked_error() from None
        stale = self.holder()  # a record left by a holder whose lease expired
        owner = self._fresh(Owner.me(run_id))
        self._lease, self.owner, self.lost, self._renewed = lease, owner, None, True
        try:
            retrying(lambda: self._write(owner), self._uri())
        except BaseException:
            self.release()
            raise
        if stale is not None:
            log.warning(
                "Took over the expired run lease of %s (%s).", self.run_dir, stale.describe()
            )
        self._hold(owner)

    def holder(self) -> Owner | None:
        from azure.core.exceptions import ResourceNotFoundError

        def read() -> bytes | None:
            try:
                return self._client().download_blob().readall()
            except ResourceNotFoundError:
                return None
            except Exception as exc:
                if is_transient(exc):
                    raise
                raise _store_error(self._uri(), exc) from None

        data = retrying(read, self._uri())
        try:
            return Owner(**json.loads(data)) if data else None
        except (ValueError, TypeError):
            return None

    # -- the store's part --------------------------------------------------------------------
    def _held(self) -> bool:
        return self._lease is not None

    def _delete(self) -> None:
        self._client().delete_blob(lease=self._lease)

    def _forget(self) -> None:
        self._lease = None

    def _describe(self) -> str:
        return f"Azure's blob lease on {self._uri()}"

    def _take(self, lease_id: str):
        """Create the record if absent, then lease it with ``lease_id`` (idempotent)."""
        from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

        blob = self._client()
        for _ in range(3):  # the record may be deleted (a holder's release) between the two
            try:
                blob.upload_blob(b"", overwrite=False)
            except ResourceExistsError:
                pass
            except Exception as exc:
                raise self._classified(exc) from None
            try:
                return blob.acquire_lease(lease_duration=int(self.lease_seconds), lease_id=lease_id)
            except ResourceNotFoundError as exc:
                if "ContainerNotFound" in str(exc):
                    raise _store_error(self._uri(), exc) from None
            except Exception as exc:
                raise self._classified(exc) from None
        raise LeaseConflict("the record kept disappearing")

    def _renew(self, owner: Owner) -> None:
        owner = self._fresh(owner)
        with self._guard:
            lease = self._lease
            if lease is None:
                return
            try:
                lease.renew()
                if self._lease is lease:  # not released meanwhile (release does not wait)
                    self._write(owner)
            except Exception as exc:
                raise self._classified(exc) from None

    def _write(self, owner: Owner) -> None:
        body = json.dumps(dataclasses.asdict(owner)).encode()
        try:
            self._client().upload_blob(body, overwrite=True, lease=self._lease)
        except Exception as exc:
            raise self._classified(exc) from None
        self.owner, self._renewed = owner, True

    def _classified(self, exc: Exception) -> Exception:
        """A lease conflict, a transient error as it is, or an error naming the fix."""
        from azure.core.exceptions import HttpResponseError

        if isinstance(exc, (LeaseConflict, KerasDLError)) or is_transient(exc):
            return exc
        if isinstance(exc, HttpResponseError) and exc.status_code in (409, 412):
            return LeaseConflict(exc.error_code or str(exc.status_code))
        return _store_error(self._uri(), exc)

    def _client(self):
        """The ``BlobClient`` of the record."""
        if self._client_obj is None:
            account = azure.account_of(self.run_dir)
            service = azure.blob_service(account, **_CLIENT_OPTIONS)
            self._client_obj = service.get_blob_client(self.container, self.blob)
        return self._client_obj

    def _uri(self) -> str:
        return f"{self.run_dir}/{LEASE_FILE}"


def _store_error(uri: str, exc: Exception) -> KerasDLError:
    # azure-core's messages run on with the request id and the reply's XML: the first line and
    # Azure's error code say it.
    code = getattr(exc, "error_code", None)
    said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return KerasDLError(
        f"The run lease {uri} cannot be written or read ({said}{f' [{code}]' if code else ''}). Check that the container "
        "exists, the account's endpoint and credential (AZURE_STORAGE_CONNECTION_STRING, or "
        "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, "
        "and AZURE_STORAGE_ENDPOINT for an emulator), and that they allow creating, leasing, "
        "writing, reading and deleting blobs under the run directory."
    )
