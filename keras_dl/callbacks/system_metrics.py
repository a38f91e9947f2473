"""SystemMetrics: every rank's CPU, memory, I/O and GPU use, in the one MLflow run.

Every rank samples itself when training starts, from a background thread
(:class:`SystemSampler`) every ``every_seconds``, and when training ends, so every run has its
figures however short; the values go into the run of an :class:`MLflowLogger` as
``system/rank_<r>/<name>`` (``system/rank_1/cpu_percent``), stepped by sample number and stamped
with the time they were taken.

Only rank 0 talks to MLflow. Its own samples go to the logger's sending thread as they are
taken. The other ranks' samples reach rank 0 through the channel every rank-to-rank value of a
``fit`` already uses: a Horovod collective at the end of each epoch (like ``MetricAverage``'s
allreduce), here one allgather of the samples taken since the last one, and a last one at the
end of training. Their timestamps are those of the samples, so the charts are right; they only
arrive in the run once per epoch. (Having each rank log with a node id, as MLflow's own
system-metrics monitor does, would give every rank a tracking client and credentials, and a
rank whose store is slow would hold up nothing but itself; one writer keeps the run's
buffering, retries and failure reporting in one place.)

Example:
    >>> logger = MLflowLogger(experiment="my-exp")                                  # doctest: +SKIP
    >>> model.fit(ds, epochs=3, callbacks=[SystemMetrics(logger, 10), logger])      # doctest: +SKIP
"""

from __future__ import annotations

import logging

import keras
import numpy as np

from keras_dl.callbacks.mlflow_logger import MLflowLogger
from keras_dl.callbacks.system_sampler import NAMES, SystemSampler
from keras_dl.distribute.world import current_world

log = logging.getLogger(__name__)

_INDEX = {name: i for i, name in enumerate(NAMES)}


class SystemMetrics(keras.callbacks.Callback):
    """Log each rank's system figures into ``logger``'s run every ``every_seconds``.

    Put it before ``logger`` in the callbacks list, so its last samples are queued before the
    logger's final flush. Under Horovod every rank must have it (its epoch end is collective).

    Args:
        logger: The :class:`MLflowLogger` whose run (and sending thread) gets the values.
        every_seconds: Seconds between samples; 0 turns it off. Defaults to 10.
        also: Called on rank 0 as ``also(rank, values)`` with every rank's samples as they
            reach rank 0 (e.g. :meth:`PrometheusMetrics.record_system`), from the sampling
            thread or at an epoch end. Defaults to None.
    """

    def __init__(self, logger: MLflowLogger, every_seconds: float = 10.0, also=None):
        super().__init__()
        self.logger = logger
        self.every_seconds = every_seconds
        self.also = also
        self._sampler: SystemSampler | None = None

    def on_train_begin(self, logs=None):
        self.close()
        self._world = current_world()
        self._gathers = 0
        self._early: list = []  # rank 0's samples the logger could not take yet
        if self.every_seconds <= 0:
            return
        deliver = self._deliver if self._world.is_chief else None
        self._sampler = SystemSampler(self.every_seconds, deliver)
        self._sampler.start()
        if self._world.is_chief:
            log.info("SystemMetrics: every %gs; %s.", self.every_seconds, self._sampler.gpu_status)

    def on_epoch_end(self, epoch, logs=None):
        if self._sampler is not None:
            self._gather()

    def on_train_end(self, logs=None):
        if self._sampler is not None:
            self._sampler.stop()
            self._gather()
            self._sampler = None
        lost = [e for e in self._early if not self.logger.log_metrics(*e)]
        if lost:  # the logger's sending thread never ran while fit did
            log.warning(
                "SystemMetrics: %d sample(s) of rank 0 were not logged: the MLflowLogger's "
                "sending thread was not running (its on_train_begin failed, or it ended early).",
                len(lost),
            )
        self._early = []

    def close(self) -> None:
        """Stop the sampling thread without a last gather: for a ``fit`` that raised (Keras
        then skips ``on_train_end``). Idempotent."""
        if self._sampler is not None:
            self._sampler.stop(last_sample=False)
            self._sampler = None

    # -- internals ---------------------------------------------------------------------------
    def _deliver(self, step: int, timestamp_ms: int, values: dict) -> None:
        """Rank 0's own samples, from the sampling thread, straight to the logger's queue.

        Samples taken before the logger's sending thread runs (it starts in the logger's
        ``on_train_begin``, after this callback's, and creating the run takes a moment) wait
        here and go first once it does."""
        if self.also is not None:
            self.also(0, values)
        self._early.append((_named(0, values), step, timestamp_ms))
        while self._early and self.logger.log_metrics(*self._early[0]):
            self._early.pop(0)

    def _gather(self) -> None:
        """Bring the other ranks' samples to rank 0 (collective under Horovod)."""
        if self._world.size == 1:
            return
        from keras_dl.distribute.collective import allgather_rows

        rows = _encode(self._world.rank, self._sampler.drain())
        # Collective: every rank sends the samples it took since the last gather (rank 0 none:
        # it delivered its own), and gets back every rank's.
        gathered = allgather_rows(rows, prefix=f"system_metrics.{self._gathers}")
        self._gathers += 1
        if self._world.is_chief:
            for (rank, step, stamp), values in _decode(gathered).items():
                self.logger.log_metrics(_named(rank, values), step, stamp)
                if self.also is not None:
                    self.also(rank, values)


def _named(rank: int, values: dict) -> dict[str, float]:
    return {f"system/rank_{rank}/{k}": v for k, v in values.items()}


def _encode(rank: int, samples: list) -> np.ndarray:
    """One row per value: (rank, step, timestamp ms, name index, value). A first row with name
    index -1 says only that this rank took part (an allgather of nothing is not portable)."""
    rows = [(rank, -1, 0, -1, 0.0)]
    for step, stamp, values in samples:
        rows += [(rank, step, stamp, _INDEX[k], v) for k, v in values.items() if k in _INDEX]
    return np.asarray(rows, dtype=np.float64)


def _decode(rows: np.ndarray) -> dict[tuple[int, int, int], dict[str, float]]:
    out: dict[tuple[int, int, int], dict[str, float]] = {}
    for rank, step, stamp, index, value in rows.tolist():
        if index >= 0:
            out.setdefault((int(rank), int(step), int(stamp)), {})[NAMES[int(index)]] = value
    return out
