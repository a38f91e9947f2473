"""Automatic recovery: relaunch a Horovod job whose rank died or was preempted.

Modelled on TF Model Garden's ``recovery_max_trials``: no cluster manager, just the driver
running the job again, up to ``runtime.max_restarts`` times, in the same MLflow run. Each attempt
resumes from the newest checkpoint in ``runtime.run_dir`` (rank 0 restores it, every rank starts
at its step). Restarted: a rank killed or crashing in native code, a rank preempted
(SIGTERM/SIGINT reached it but not the driver, e.g. a decommissioned Spark executor), and a
stall. Not restarted: a Python error in a rank (a bad table, a diverged model: the same code would
fail the same way) and a signal to the driver itself (the whole job is being stopped).

Each restart is logged to the run: the metric ``keras_dl.restarts`` (its count, at that step) and
the tag ``keras_dl.restart.N`` (its cause).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from keras_dl.errors import DistributedError, KerasDLError, Preempted


def run_with_recovery(
    attempt: Callable[[], Any],
    max_restarts: int,
    log_restart: Callable[[int, str], None],
) -> Any:
    """Call ``attempt()`` until it returns, restarting it after a restartable failure.

    Args:
        attempt: Runs the job once (``HorovodRunner.run``).
        max_restarts: Restarts allowed after the first attempt.
        log_restart: ``fn(count, cause)`` called before each restart.

    Returns:
        What the successful attempt returned.

    Raises:
        KerasDLError: The last failure, when it is not restartable, the driver was signalled,
            or the restarts are used up (then the message says how many were made).
    """
    restarts = 0
    while True:
        with driver_signals() as signalled:
            try:
                return attempt()
            except KerasDLError as exc:
                error = exc
        if signalled() or not restartable(error):
            raise error
        if restarts >= max_restarts:
            if restarts:
                error.args = (f"{error} (after {restarts} automatic restart(s))",)
            raise error
        restarts += 1
        log_restart(restarts, str(error))


def restartable(error: BaseException) -> bool:
    """True for a rank that died, was preempted or stalled; False for a Python error."""
    if isinstance(error, Preempted):
        return True
    if not isinstance(error, DistributedError):
        return False
    text = str(error)
    return any(s in text for s in (" died", "StallError", "Horovod stalled"))


@contextlib.contextmanager
def driver_signals():
    """Tell whether this process got SIGTERM/SIGINT while the block ran, and restore the
    handlers after it.

    Horovod's launcher installs its own handlers (they stop the ranks) and never puts the old
    ones back; and it hides the signal. The wakeup fd sees every signal whatever Python handler
    runs, so it is how the driver learns it was signalled. Yields a function returning True
    then.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    got: list[int] = []

    def signalled() -> bool:
        with contextlib.suppress(BlockingIOError, OSError):
            got.extend(os.read(r, 64))
        return any(s in (signal.SIGTERM, signal.SIGINT) for s in got)

    try:
        yield signalled
    finally:
        signalled()  # drain before the fd goes
        signal.set_wakeup_fd(previous)
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)
        os.close(r)
        os.close(w)
