"""Riding out a short object-store outage: one retry policy for every store call that matters.

A store that stops answering for a while (a restart, a network partition, throttling) should
not end a training that holds its run directory's lease. :func:`retrying` runs one store call
and, while it fails with a *transient* error (:func:`is_transient`: a timeout, a refused or
reset connection, an HTTP 5xx or throttling reply), calls it again with backoff:

- it logs (and so prints) one line every :data:`REPORT_EVERY` seconds while it waits:
  ``object store s3://lake unreachable for 20 s; retrying until 60 s``;
- it gives up at the deadline, the time until which the run's lease stays valid: the run lease
  (:mod:`keras_dl.runlock`) registers it with :func:`hold_deadline`, and it moves on each time
  the lease is renewed. With no lease held, the deadline is :data:`DEFAULT_PATIENCE` seconds
  after the first failure;
- then it raises :class:`~keras_dl.errors.StoreUnavailable` (exit 75; the run ends KILLED, and
  rerunning the command resumes from the last checkpoint).

Anything else (a missing file, denied access, a bad request) is raised at once, as it was.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from keras_dl.errors import DataError, KerasDLError, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

REPORT_EVERY = 10.0  # seconds between two "unreachable" lines
DEFAULT_PATIENCE = 60.0  # seconds, when no lease says how long the run may wait
FIRST_BACKOFF, MAX_BACKOFF = 0.5, 4.0  # seconds between attempts: doubling, capped

# pyarrow's S3 errors carry the AWS SDK's error name and curl's code in the message; its Azure
# errors the Azure SDK's ("Azure Error: [ServerBusy] 503 ...", "Fail to get a new connection",
# curl's "CURLE code: 56. Failure when receiving data from the peer");
# deltalake's (OSError) object_store's ("error sending request ... connection error").
_TRANSIENT_TEXT = re.compile(
    r"curlCode|NETWORK_CONNECTION|Timeout was reached|timed? ?out|Couldn't connect|"
    r"Connection refused|Connection reset|Connection aborted|Broken pipe|"
    r"HTTP status 5\d\d|HTTP response code: 5\d\d|SERVICE_UNAVAILABLE|SLOW_DOWN|SlowDown|"
    r"INTERNAL_FAILURE|InternalError|ServiceUnavailable|REQUEST_TIMEOUT|RequestTimeout|"
    r"Azure Error: \[[^\]]*\] 5\d\d|Fail to get a new connection|Could not connect to server|"
    r"ServerBusy|OperationTimedOut|CURLE code|error sending request|connection error",
    re.IGNORECASE,
)
_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "503"}

_deadlines: list[Callable[[], float | None]] = []
_given_up: set[str] = set()  # stores a retry gave up on: others fail at once, until one answers
_deadlines_guard = threading.Lock()


def hold_deadline(deadline: Callable[[], float | None]) -> None:
    """Register ``deadline()``: the wall-clock time (``time.time()``) retries may last until.

    The run lease registers the time its lease stays valid while it holds it; the earliest
    registered deadline applies. ``deadline()`` returning None is ignored.
    """
    with _deadlines_guard:
        _deadlines.append(deadline)


def drop_deadline(deadline: Callable[[], float | None]) -> None:
    """Undo :func:`hold_deadline` (no error when it was not registered)."""
    with _deadlines_guard:
        if deadline in _deadlines:
            _deadlines.remove(deadline)


_leased_patience: list[float] = []  # set on a rank whose launcher holds the lease


def wait_within_lease(lease_seconds: float) -> None:
    """On a Horovod rank: retry for as long as the launcher's lease surely stays valid.

    The launcher holds the run's lease and renews it every ``lease_seconds / 3``; a rank cannot
    see the renewals, so from its first failed call it waits two thirds of ``lease_seconds``
    (the least time the lease outlives an outage) instead of :data:`DEFAULT_PATIENCE`.
    """
    _leased_patience[:] = [2.0 * float(lease_seconds) / 3.0]


def _deadline(first_failure: float) -> tuple[float, bool]:
    """``(wall-clock deadline, whether a lease set it)``."""
    held = lease_deadline()
    if held is not None:
        return held, True
    if _leased_patience:
        return first_failure + _leased_patience[0], True
    return first_failure + DEFAULT_PATIENCE, False


def is_transient(exc: BaseException) -> bool:
    """True for an error a working store stops giving: timeouts, refused or reset connections,
    HTTP 5xx and throttling (pyarrow's ``OSError``, botocore's and azure-core's connection and
    5xx errors)."""
    if isinstance(exc, (KerasDLError, FileNotFoundError, PermissionError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    try:
        from botocore.exceptions import ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:  # pragma: no cover - boto3 is optional
        ClientError = HTTPClientError = BotoConnectionError = ()  # noqa: N806
    if isinstance(exc, (HTTPClientError, BotoConnectionError)):
        return True  # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ...
    if isinstance(exc, ClientError):
        reply = exc.response or {}
        status = reply.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or reply.get("Error", {}).get("Code") in _TRANSIENT_CODES
    try:
        from azure.core.exceptions import (
            HttpResponseError,
            ServiceRequestError,
            ServiceResponseError,
        )
    except ImportError:  # pragma: no cover - azure-storage-blob is optional
        HttpResponseError = ServiceRequestError = ServiceResponseError = ()  # noqa: N806
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return True  # no connection, a timed-out or cut reply (azure-storage-blob)
    if isinstance(exc, HttpResponseError):
        code = getattr(exc, "error_code", None)  # set from a reply's x-ms-error-code
        return (exc.status_code or 0) >= 500 or code in ("ServerBusy", "OperationTimedOut")
    return isinstance(exc, OSError) and bool(_TRANSIENT_TEXT.search(str(exc)))


def store_name(uri: str) -> str:
    """How a message names the store of ``uri``: ``s3://bucket``."""
    scheme, sep, rest = uri.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}" if sep else uri


def retrying(call: Callable[[], T], uri: str, landed: Callable[[], T | None] | None = None) -> T:
    """``call()``, called again with backoff while it fails transiently (see the module).

    Args:
        call: One store operation on ``uri``, safe to repeat (a whole read, write or listing),
            or one that must not happen twice, with ``landed``.
        uri: The file or folder it works on; messages name its store.
        landed: For a call that must not be repeated once it took effect (a Delta commit whose
            reply was lost): before each new attempt, ``landed()`` looks for its effect, and
            what it returns (not None) is returned instead of calling again. Its transient
            failures are waited out as the call's are.

    Raises:
        StoreUnavailable: The store still failed at the deadline.
        Exception: ``call``'s own error when it is not transient.
    """
    store = store_name(uri)
    start, start_wall = time.monotonic(), time.time()  # the outage counts from the first call
    call = _watched(call, store)
    landed = None if landed is None else _watched(landed, store)
    try:
        result = call()
        _given_up.discard(store)
        return result
    except Exception as exc:
        if not is_transient(exc):
            raise
        error = exc
    if store in _given_up:  # the run is stopping for this outage: no second wait
        raise StoreUnavailable(store, 0.0, True, error) from None
    pause = FIRST_BACKOFF
    with _Reporter(store, start, start_wall):  # a line every 10 s, even while a call hangs
        while True:
            deadline, leased = _deadline(start_wall)
            if time.time() >= deadline or store in _given_up:
                _given_up.add(store)
                raise StoreUnavailable(store, time.monotonic() - start, leased, error) from None
            time.sleep(min(pause, max(deadline - time.time(), 0.0)))
            pause = min(pause * 2, MAX_BACKOFF)
            try:
                result = None if landed is None else landed()
                if result is None:
                    result = call()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                error = exc
                continue
            _given_up.discard(store)
            if time.monotonic() - start >= REPORT_EVERY:
                log.warning(
                    "object store %s reachable again after %.0f s",
                    store,
                    time.monotonic() - start,
                )
            return result


_in_flight: dict[int, tuple[str, float]] = {}  # a call's id -> (its store, when it started)
_flights, _flights_guard = itertools.count(), threading.Lock()


def _watched(call: Callable[[], T], store: str) -> Callable[[], T]:
    """``call``, recorded in :func:`calls_in_flight` while it runs (for the watchdog)."""

    def watched() -> T:
        key = next(_flights)
        with _flights_guard:
            _in_flight[key] = (store, time.time())
        try:
            return call()
        finally:
            with _flights_guard:
                del _in_flight[key]

    return watched


def calls_in_flight() -> list[tuple[str, float]]:
    """``(store, wall-clock start)`` of each store call :func:`retrying` is making now."""
    with _flights_guard:
        return list(_in_flight.values())


def lease_deadline() -> float | None:
    """The time the run's lease stays valid until (as :func:`hold_deadline` registered it), or
    None when no lease is held in this process."""
    with _deadlines_guard:
        held = [d for d in (f() for f in _deadlines) if d is not None]
    return min(held) if held else None


_last_report: dict[str, float] = {}  # store -> when a line last said it is unreachable


class _Reporter:
    """While a retry waits: one line every :data:`REPORT_EVERY` s per store (whichever of the
    threads waiting on it says it first), from a daemon thread, so a call that hangs does not
    silence it."""

    def __init__(self, store: str, start: float, start_wall: float):
        self.store, self.start, self.start_wall = store, start, start_wall
        self.done = threading.Event()

    def __enter__(self) -> _Reporter:
        self._report_if_due()  # the first call may have hung past REPORT_EVERY already
        threading.Thread(target=self._run, name="keras_dl-store-retry", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()

    def _run(self) -> None:
        while not self.done.wait(REPORT_EVERY - (time.monotonic() - self.start) % REPORT_EVERY):
            self._report_if_due()

    def _report_if_due(self) -> None:
        now = time.monotonic()
        waited = now - self.start
        with _deadlines_guard:
            if waited < REPORT_EVERY - 0.5 or now - _last_report.get(self.store, -1e9) < (
                REPORT_EVERY - 0.5
            ):
                return
            _last_report[self.store] = now
        deadline = _deadline(self.start_wall)[0]
        log.warning(
            "object store %s unreachable for %.0f s; retrying until %.0f s",
            self.store,
            waited,
            deadline - self.start_wall,
        )


def check_root(
    look: Callable[[], bool],
    uri: str,
    key: tuple,
    unreachable: Callable[[Exception], str],
    missing: str,
) -> None:
    """Fail early when the bucket or container of ``uri`` cannot be reached.

    ``look()`` says whether it exists. One that answered once in this process (as ``key``: the
    endpoint and its name) is in an outage when it stops answering: the look is then retried
    (:func:`retrying`). One never reached fails at once.

    Raises:
        StoreUnavailable: One that answered before did not answer again in time.
        DataError: ``unreachable(error)`` when the look failed; ``missing`` when it found none.
    """
    try:
        found = retrying(look, uri) if key in _answered else look()
    except KerasDLError:
        raise
    except Exception as exc:
        raise DataError(unreachable(exc)) from None
    if not found:
        raise DataError(missing)
    _answered.add(key)


_answered: set[tuple] = set()  # the (endpoint, bucket or container) check_root found


__all__ = [
    "calls_in_flight",
    "check_root",
    "DEFAULT_PATIENCE",
    "REPORT_EVERY",
    "drop_deadline",
    "hold_deadline",
    "is_transient",
    "lease_deadline",
    "retrying",
    "store_name",
]
