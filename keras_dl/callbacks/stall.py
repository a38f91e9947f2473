"""StallWatchdog: end a Horovod job whose rank waits too long in a collective.

Without it a rank whose peer never joins an allreduce (stuck reading its input, in a debugger,
or running a different number of steps) waits forever. Horovod's own stall inspector
(``HOROVOD_STALL_CHECK_TIME_SECONDS`` / ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``) never fired in
this build (0.28.1 over Gloo): a rank waited 30 s on a peer under a 5 s shutdown time and simply
finished when the peer came. So the watch is kept here, in Python, around the parts of ``fit``
that wait on every rank:

- each training step (its gradient allreduce);
- the start of training (``BroadcastState``'s broadcast of rank 0's state);
- the end of each epoch (``MetricAverage``'s allreduce of the logs).

A thread checks the open section once a second. When one has lasted ``timeout`` seconds it
writes the failure marker that :func:`keras_dl.distribute.failures.explain_failure` reads, and
ends this process: the launcher then stops the other ranks and names this rank and the section.
Validation and prediction hold no collective and are not watched.
"""

from __future__ import annotations

import os
import threading
import time

import keras

from keras_dl.errors import DistributedError


class StallError(DistributedError):
    """A rank waited longer than the stall timeout in a collective."""


class StallWatchdog(keras.callbacks.Callback):
    """End this rank when one collective-holding part of ``fit`` lasts over ``timeout`` s.

    Put it first in the callbacks list, before ``MetricAverage`` and ``BroadcastState``, so
    that it opens each section before they wait.

    Args:
        timeout: Seconds a section may last. Defaults to the ``KERAS_DL_STALL_TIMEOUT``
            environment variable (set by ``HorovodRunner``), else 120.
        exit: Called as ``exit(error)`` when a section times out. Defaults to writing the
            failure marker and ``os._exit(1)`` (the main thread is blocked in native code).
    """

    def __init__(self, timeout: float | None = None, exit=None):
        super().__init__()
        self.timeout = float(timeout or os.environ.get("KERAS_DL_STALL_TIMEOUT") or 120)
        self._exit = exit or _end_rank
        self._lock = threading.Lock()
        self._section: tuple[str, float] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def on_train_begin(self, logs=None):
        self._epoch = 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="StallWatchdog", daemon=True)
        self._thread.start()
        self._open("the broadcast of rank 0's starting state")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._close()

    def on_train_batch_begin(self, batch, logs=None):
        self._open(f"the gradient allreduce of epoch {self._epoch + 1}, step {batch + 1}")

    def on_train_batch_end(self, batch, logs=None):
        self._close()

    def on_epoch_end(self, epoch, logs=None):
        self._open(f"the metric average at the end of epoch {epoch + 1}")

    def on_train_end(self, logs=None):
        self._close()
        self._stop.set()

    # -- internals ---------------------------------------------------------------------------
    def _open(self, what: str) -> None:
        with self._lock:
            self._section = (what, time.monotonic())

    def _close(self) -> None:
        with self._lock:
            self._section = None

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                section = self._section
            if section is None or time.monotonic() - section[1] < self.timeout:
                continue
            rank = os.environ.get("HOROVOD_RANK", "?")
            self._exit(
                StallError(
                    f"rank {rank} waited more than {self.timeout:g} s (runtime.stall_timeout) "
                    f"in {section[0]}: another rank never joined it. Look for a rank stuck "
                    "reading its input, running a different number of steps, or stopped in a "
                    "debugger (its output is above); raise runtime.stall_timeout if a step can "
                    "legitimately take longer."
                )
            )
            return


def _end_rank(error: StallError) -> None:
    from keras_dl.distribute.failures import report_failure

    try:
        raise error
    except StallError as exc:
        report_failure(exc)  # the marker line the launcher reads to name this rank
    os._exit(1)
