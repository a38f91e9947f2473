"""What the object-store leases share: holding, renewing and giving up a lease on a record."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from keras_dl.runlock.base import Owner, RunLock, RunLockedError
from keras_dl.storage.retry import drop_deadline, hold_deadline, retrying

log = logging.getLogger(__name__)

RETRY_BEAT = 1.0  # seconds between renewal attempts while the store does not answer


class LeaseConflict(Exception):
    """The store refused a lease operation: another holder has the lease, or took it over."""


class Lease(RunLock):
    """A :class:`RunLock` held as a lease on an owner record in an object store.

    The store-specific part is taking the lease (:meth:`acquire`), renewing it (:meth:`_renew`,
    raising :class:`LeaseConflict` when it was taken over), deleting the record
    (:meth:`_delete`) and reading it (:meth:`holder`). This class keeps the rest:

    - a daemon thread renews the lease every third of ``lease_seconds``, and every
      :data:`RETRY_BEAT` seconds while the store does not answer;
    - a renewal refused by the store marks the lease lost (:attr:`lost`), logged as an error;
      the next :meth:`update` raises :class:`RunLockedError` naming the new holder;
    - while it is held, store calls retried through an outage (:mod:`keras_dl.storage.retry`)
      wait until the lease's expiry and no longer;
    - :meth:`release` does not wait on the store.

    Args:
        run_dir: The run directory's URI.
        lease_seconds: Validity of the lease without renewal (> 0).
    """

    renewal_fix = "give this run its own directory, or rerun it to resume"

    def __init__(self, run_dir: str, lease_seconds: float):
        super().__init__(run_dir.rstrip("/"))
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}.")
        self.lease_seconds = float(lease_seconds)
        self.lost: str | None = None  # why the lease was lost while held, if it was
        self._guard = threading.Lock()  # one lease call at a time (heartbeat vs update)
        self._stop = threading.Event()
        self._renewed = True  # the store answered the last renewal

    # -- the store's part ----------------------------------------------------------------------
    def _held(self) -> bool:
        """True while this process holds the lease (it has the store's token for it)."""
        raise NotImplementedError

    def _renew(self, owner: Owner) -> None:
        """Extend the lease and write ``owner`` (freshly dated) as the record."""
        raise NotImplementedError

    def _delete(self) -> None:
        """Delete the record while still holding it, which ends the lease."""
        raise NotImplementedError

    def _forget(self) -> None:
        """Drop the store's token: this process no longer holds the lease."""
        raise NotImplementedError

    def _uri(self) -> str:
        """The record's URI."""
        raise NotImplementedError

    def _describe(self) -> str:
        """What the lease is, for the error of a run that finds it held."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------
    def update(self, run_id: str) -> None:
        """Record the MLflow run in the owner record (renewing the lease).

        Raises:
            RunLockedError: The lease was taken over: this process no longer holds the run
                directory (it could not renew within the lease's duration).
        """
        if not self._held() or self.owner is None:
            return
        owner = dataclasses.replace(self.owner, run_id=run_id)
        try:
            retrying(lambda: self._renew(owner), self._uri())
        except LeaseConflict:
            holder = self.holder()
            self.lost = f"the lease {self._uri()} was taken over by {holder}"
            raise RunLockedError(
                f"This training lost runtime.run_dir={self.run_dir}: its lease {self._uri()} is "
                f"now held by {holder.describe() if holder else 'another process'}. It was not "
                f"renewed within {self.lease_seconds:g} s (the store unreachable, or this "
                f"process stalled); {self.renewal_fix}."
            ) from None

    def release(self) -> None:
        """Give the lease up without waiting on the store: the heartbeat is told to stop, not
        joined (it may be inside a call to a store that does not answer), and the record is
        deleted only when the store answered the last renewal. Otherwise the lease lapses by
        itself at its expiry."""
        if not self._held():
            return
        self._stop.set()
        drop_deadline(self._valid_until)
        if self._guard.acquire(timeout=0.5):  # else the heartbeat is inside a renewal
            try:
                if self.lost is None and self._renewed:  # taken over: another run's now
                    self._delete()
            except Exception as exc:  # taken over meanwhile, or unreachable: it expires anyway
                log.warning("Could not delete the run lease %s (%s).", self._uri(), exc)
            finally:
                self._forget()
                self.owner = None
                self._guard.release()
        else:
            self._forget()
            self.owner = None

    def _locked_error(self) -> RunLockedError:
        error = super()._locked_error()
        return RunLockedError(
            f"{error} The lease is {self._describe()}: it lapses {self.lease_seconds:g} s after "
            "its holder stops renewing it, and a run started after that takes it over."
        )

    def _hold(self, owner: Owner) -> None:
        """Start holding: ``owner`` is the record written, the heartbeat renews it."""
        self.owner, self.lost, self._renewed = owner, None, True
        self._stop = threading.Event()  # a thread of an earlier hold keeps its own, set
        hold_deadline(self._valid_until)
        threading.Thread(target=self._heartbeat, name="keras_dl-lease", daemon=True).start()

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
            except LeaseConflict:
                self.lost = f"the lease {self._uri()} was taken over by {self.holder()}"
                log.error("Run directory %s: %s.", self.run_dir, self.lost)
                return
            except Exception as exc:  # the store did not answer: try again soon
                if not stop.is_set():
                    log.debug("Could not renew the run lease %s (%s).", self._uri(), exc)
                self._renewed, beat = False, min(RETRY_BEAT, self.lease_seconds / 3)

    def _fresh(self, owner: Owner) -> Owner:
        return dataclasses.replace(owner, expires=time.time() + self.lease_seconds)
