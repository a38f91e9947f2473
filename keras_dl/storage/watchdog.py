"""The last resort against a store call that hangs past the run's lease: end the process.

:func:`~keras_dl.storage.retry.retrying` gives up at the lease's expiry, but only between two
attempts: a call that never returns (pyarrow's Azure client has no request timeout, and a
blocked C++ call cannot be interrupted from Python) would hold the run past its lease, while
another run may take the lease over. :func:`install` starts a daemon thread that, once a
store call has been running :data:`GRACE` seconds past the lease's expiry:

- logs the :class:`~keras_dl.errors.StoreUnavailable` error (the store, how long it waited);
- runs the actions registered with :func:`on_expiry` (the run marks its MLflow run KILLED,
  tagged ``preempted=STORE_UNAVAILABLE``), each given at most :data:`ACTION_SECONDS`;
- prints ``error: ...`` to stderr, flushes, and ends the process with exit code 75
  (``os._exit``: the blocked thread cannot be joined). Rerunning the command resumes.

Only the command line's training process installs it: a notebook's kernel is never ended.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from keras_dl.errors import StoreUnavailable
from keras_dl.storage.retry import calls_in_flight, lease_deadline

log = logging.getLogger(__name__)

GRACE = 5.0  # seconds past the lease's expiry: retrying's own StoreUnavailable comes first
ACTION_SECONDS = 15.0  # at most, per expiry action (the tracking server may be down too)
CHECK_EVERY = 1.0

_actions: list[Callable[[StoreUnavailable], None]] = []
_installed: list[threading.Thread] = []


def on_expiry(action: Callable[[StoreUnavailable], None]) -> Callable[[], None]:
    """Run ``action(error)`` before the watchdog ends the process; returns its undo."""
    _actions.append(action)
    return lambda: _actions.remove(action) if action in _actions else None


def install() -> None:
    """Start the watchdog's thread in this process (once)."""
    if not _installed:
        thread = threading.Thread(target=_watch, name="keras_dl-store-watchdog", daemon=True)
        _installed.append(thread)
        thread.start()


def overdue(now: float | None = None) -> StoreUnavailable | None:
    """The error for a store call running :data:`GRACE` s past the lease's expiry, or None."""
    now = time.time() if now is None else now
    deadline = lease_deadline()
    if deadline is None or now < deadline + GRACE:
        return None
    stuck = [(store, start) for store, start in calls_in_flight() if start < deadline]
    if not stuck:
        return None
    store, start = min(stuck, key=lambda s: s[1])
    return StoreUnavailable(store, now - start, True, "a store call did not return")


def _watch() -> None:
    while True:
        time.sleep(CHECK_EVERY)
        error = overdue()
        if error is not None:
            _end(error)


def _end(error: StoreUnavailable) -> None:
    log.error("%s", error)
    for action in list(_actions):
        done = threading.Thread(target=_quietly, args=(action, error), daemon=True)
        done.start()
        done.join(ACTION_SECONDS)
    print(f"error: {error}", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: S110 - ending anyway
            pass
    os._exit(error.exit_code)


def _quietly(action, error) -> None:
    try:
        action(error)
    except Exception as exc:
        log.warning("while ending the run for the store outage: %s", exc)


__all__ = ["ACTION_SECONDS", "GRACE", "install", "on_expiry", "overdue"]
