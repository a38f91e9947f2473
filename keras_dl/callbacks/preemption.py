"""Preemption: on SIGTERM or SIGINT, finish the step, checkpoint where training is, and stop.

Spot VMs, Kubernetes and Spark decommissioning send SIGTERM and kill the process some seconds
later. With this callback the signal only sets a flag; at the end of the current step the
:class:`~keras_dl.callbacks.checkpoint.Checkpoint` given writes a mid-epoch checkpoint (model,
optimizer with its step counter, RNG states; the step is the data position) and :class:`Preempted`
ends ``fit``. Rerunning the same command resumes from that step. Under Horovod the ranks agree
after every step (one small allreduce of the flag), so all of them stop after the same step even
when only one was signalled.

If the step does not end within ``grace`` seconds (a rank stuck reading input), the process exits
anyway with :data:`PREEMPTED_EXIT`. A second signal ends it at once.

Example:
    >>> ckpt = Checkpoint("runs/my-model/checkpoints")                      # doctest: +SKIP
    >>> model.fit(ds, epochs=10, callbacks=[ckpt, Preemption(ckpt)])        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import keras

from keras_dl.distribute.world import current_world
from keras_dl.errors import PREEMPTED_EXIT, Preempted

__all__ = ["PREEMPTED_EXIT", "Preempted", "Preemption"]

log = logging.getLogger(__name__)


class Preemption(keras.callbacks.Callback):
    """Turn SIGTERM/SIGINT into a checkpoint at the end of the current step and :class:`Preempted`.

    Put it after the ``Checkpoint`` (it asks that one to save) and, under Horovod, after
    ``MetricAverage``. Signal handlers are installed for the duration of ``fit`` (main thread
    only) and the previous ones restored after.

    Args:
        checkpoint: The ``Checkpoint`` callback that saves the position. Defaults to None
            (stop without saving).
        grace: Seconds from the signal to a forced exit if the step never ends (once it ends,
            the exit is called off). Defaults to 25.
        signals: The signals handled. Defaults to (SIGTERM, SIGINT).
    """

    def __init__(
        self, checkpoint=None, grace: float = 25.0, signals=(signal.SIGTERM, signal.SIGINT)
    ):
        super().__init__()
        self.checkpoint = checkpoint
        self.grace = grace
        self.signals = tuple(signals)
        self.received: str | None = None
        self._previous: dict = {}
        self._deadline: threading.Timer | None = None  # the forced exit, once a signal came

    def on_train_begin(self, logs=None):
        self.received = None
        self._world_size = current_world().size
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)

    def on_train_batch_end(self, batch, logs=None):
        stop = self.received is not None
        if self._world_size > 1:
            # Every rank, every step: the same collective, so a signal on any rank stops all of
            # them after this very step (no rank waits in the next step's allreduce).
            from keras_dl.distribute.collective import allreduce_mean

            stop = allreduce_mean({"preempted": float(stop)}, prefix="preemption")["preempted"] > 0
        if not stop:
            return
        step = self.checkpoint.global_step if self.checkpoint is not None else -1
        if self.checkpoint is not None:
            self.checkpoint.save_now()  # rank 0 writes; the step is the data position
        self.restore_handlers()
        raise Preempted(self.received or "SIGTERM (on another rank)", step)

    def on_train_end(self, logs=None):
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Put back the signal handlers found at the start of ``fit``, and call off the forced
        exit: the step ended, so the process goes on (a notebook's kernel, a test) (idempotent)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    # -- internals ---------------------------------------------------------------------------
    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is not None:  # the second signal: no more waiting
            os._exit(PREEMPTED_EXIT)
        self.received = name
        print(
            f"Received {name}: finishing the current step, then checkpointing and stopping "
            f"(at most {self.grace:g} s; send it again to stop at once).",
            flush=True,
        )
        self._deadline = threading.Timer(self.grace, _force_exit, args=(name, self.grace))
        self._deadline.daemon = True
        self._deadline.start()


def _force_exit(name: str, grace: float) -> None:
    print(
        f"The step did not end within {grace:g} s of {name}: exiting without a new checkpoint "
        "(the previous one is kept).",
        flush=True,
    )
    os._exit(PREEMPTED_EXIT)
