"""PrometheusMetrics: a run's live figures for Prometheus, scraped from rank 0 or pushed.

The figures are the ones the run already has (:mod:`keras_dl.callbacks.prometheus_export`
lists the series): the step and epoch counted here, :class:`~keras_dl.callbacks.Throughput`'s
``epoch_stats``, the epoch's logs (loss and the validation metrics, as Keras hands them to every
callback), :class:`~keras_dl.callbacks.SystemMetrics`' samples (handed over through its
``also`` hook), :class:`~keras_dl.callbacks.preemption.Preemption`'s signal and the launcher's
restart count. Nothing is measured twice.

Rank 0 holds every rank's figures. The other ranks' reach it through the channel the system
metrics use: one allgather at the end of each epoch (SystemMetrics gathers their samples; this
callback their step, epoch, last-step time and throughput), so their series move once an epoch
while rank 0's step, epoch and seconds since the last step move at every step.

Two ways out, both optional:

- ``port``: rank 0 serves ``http://<bind>:<port>/metrics`` (0: a free port, printed) for a
  (under a Horovod launcher, ``feed`` instead: the launcher serves it, fed by rank 0)
  Prometheus to scrape, from the first step until ``fit`` ends; at the end it waits up to
  ``final_scrape_seconds`` for one more scrape, so the final values are not lost;
- ``pushgateway``: rank 0 pushes at each epoch end and at the end of ``fit`` (finished, failed
  or preempted), one group per rank (job ``keras_dl``, ``run_id``, ``rank``, and ``host``, the
  rank's host: under Horovod one allgather of the names at the start of ``fit``). The groups are
  left on the gateway at the end: a batch job's executors are gone by the time anyone looks,
  and the gateway is then the only place that holds the run's final state
  (``keras_dl_running`` 0, the last loss, the preemptions). A run killed outright leaves
  ``keras_dl_running`` at 1 with a last step growing old, which is what the no-step alert
  catches. Delete a group with ``curl -X DELETE
  <gateway>/metrics/job/keras_dl/run_id/<id>/rank/<r>/host/<host>``.
"""

from __future__ import annotations

import time

import keras
import numpy as np

from keras_dl.callbacks.prometheus_export import THROUGHPUT, RunMetrics
from keras_dl.callbacks.prometheus_feed import FeedSender
from keras_dl.distribute.world import current_world

# What each rank sends at an epoch end, by index: (rank, field index, value) rows.
FIELDS = ("step", "epoch", "last_step", *THROUGHPUT)


class PrometheusMetrics(keras.callbacks.Callback):
    """Expose the run's figures to Prometheus (see the module's docstring).

    Put it after :class:`~keras_dl.callbacks.Throughput` and before ``Preemption``; under
    Horovod every rank must have it (its epoch end is collective).

    Args:
        run_id: The MLflow run id on rank 0; None on the other ranks (they only send).
        recipe: The recipe's name, a label of every series.
        port: Serve ``/metrics`` on this port (0: a free one); None: do not serve.
            Defaults to None.
        bind: The address served on. Defaults to "127.0.0.1" (this host only).
        pushgateway: A Pushgateway URL to push to; "" does not push. Defaults to "".
        final_scrape_seconds: At the end, wait up to this long for a last scrape.
            Defaults to 0.
        throughput: The run's ``Throughput`` callback, whose epoch figures are exported.
        preemption: The run's ``Preemption`` callback, whose signal is counted.
        restarts: The launcher's automatic restarts of this run so far. Defaults to 0.
        feed: The launcher's feed URL: rank 0 sends it its figures as JSON, once a second and
            at the end (:mod:`~keras_dl.callbacks.prometheus_feed`). Defaults to "" (none).
    """

    def __init__(
        self,
        run_id: str | None,
        recipe: str,
        port: int | None = None,
        bind: str = "127.0.0.1",
        pushgateway: str = "",
        final_scrape_seconds: float = 0.0,
        throughput=None,
        preemption=None,
        restarts: int = 0,
        feed: str = "",
    ):
        super().__init__()
        self.port, self.bind, self.pushgateway = port, bind, pushgateway
        self.feed = feed
        self._sender: FeedSender | None = None
        self.final_scrape_seconds = final_scrape_seconds
        self.throughput, self.preemption = throughput, preemption
        # Built now, on rank 0: SystemMetrics hands it samples from before this on_train_begin.
        self.metrics = RunMetrics(run_id, recipe) if run_id is not None else None
        if self.metrics is not None:
            self.metrics.restarts = restarts
        self.served_port: int | None = None
        self._open = False

    def record_system(self, rank: int, values: dict) -> None:
        """SystemMetrics' hook: one rank's sample (any thread)."""
        if self.metrics is not None:
            self.metrics.set_system(rank, values)

    def on_train_begin(self, logs=None):
        self._world = current_world()
        self._gathers = 0
        optimizer = self.model.optimizer
        self._step = int(keras.ops.convert_to_numpy(optimizer.iterations)) if optimizer else 0
        self._last_step = None
        self._epoch = 0
        if self.pushgateway and self._world.size > 1:
            hosts = _gather_hosts()  # collective: every rank has this callback
            if self.metrics is not None:
                self.metrics.hosts = dict(enumerate(hosts))
        m = self.metrics
        if m is None:
            return
        self._open = True
        m.running = 1.0
        m.set_progress(0, step=self._step)
        if self.feed and self._sender is None:
            self._sender = FeedSender(self.feed, m.snapshot)
            self._sender.start()
        if self.port is not None and self.served_port is None:
            self.served_port = m.serve(self.port, self.bind)
            print(
                f"Prometheus metrics of run {m.run_id}: http://{self.bind}:{self.served_port}"
                "/metrics",
                flush=True,
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1
        if self.metrics is not None:
            self.metrics.set_progress(0, epoch=self._epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        self._last_step = time.time()
        if self.metrics is not None:
            self.metrics.set_progress(0, step=self._step, last_step=self._last_step)

    def on_epoch_end(self, epoch, logs=None):
        stats = dict(self.throughput.epoch_stats) if self.throughput is not None else {}
        if self.metrics is not None:
            self.metrics.set_epoch(0, {**(logs or {}), **stats})
        if self._world.size > 1:
            self._gather(stats)
        if self.metrics is not None and self.pushgateway:
            self.metrics.push(self.pushgateway)

    def on_train_end(self, logs=None):
        self.close()

    def close(self) -> None:
        """The end of ``fit`` (also after it raised: Keras then skips ``on_train_end``): mark
        the run ended, push, give the scraper its last look, stop serving. Idempotent."""
        m = self.metrics
        if m is None or not self._open:
            return
        self._open = False
        m.running = 0.0
        if self.preemption is not None and self.preemption.received:
            m.preemptions += 1
        if self.pushgateway:
            m.push(self.pushgateway)
        if self._sender is not None:
            self._sender.close()  # the end state; the launcher gives the scraper its last look
            self._sender = None
        if self.served_port is not None:
            m.wait_for_scrape(self.final_scrape_seconds)
            m.stop_serving()
            self.served_port = None

    # -- internals ---------------------------------------------------------------------------
    def _gather(self, stats: dict) -> None:
        """Bring the other ranks' progress and throughput to rank 0 (collective)."""
        from keras_dl.distribute.collective import allgather_rows

        rank = self._world.rank
        values = {"step": self._step, "epoch": self._epoch, "last_step": self._last_step}
        values.update({k: v for k, v in stats.items() if k in THROUGHPUT})
        rows = [
            (rank, -1, 0.0)
        ]  # says this rank took part (an allgather of nothing is not portable)
        rows += [(rank, FIELDS.index(k), float(v)) for k, v in values.items() if v is not None]
        gathered = allgather_rows(np.asarray(rows), prefix=f"prometheus.{self._gathers}")
        self._gathers += 1
        if self.metrics is None:
            return
        by_rank: dict[int, dict] = {}
        for r, index, value in gathered.tolist():
            if index >= 0 and int(r) != 0:
                by_rank.setdefault(int(r), {})[FIELDS[int(index)]] = value
        for r, got in by_rank.items():
            progress = {k: got[k] for k in ("step", "epoch", "last_step") if k in got}
            self.metrics.set_progress(r, **progress)
            self.metrics.set_epoch(r, {k: v for k, v in got.items() if k in THROUGHPUT})


def _gather_hosts() -> list[str]:
    """Every rank's host name, in rank order (a collective of either engine: every rank calls
    it; under the multi-worker strategy Horovod's allgather was called and failed)."""
    import socket

    from keras_dl.distribute import collective

    return collective.allgather_text(socket.gethostname(), prefix="prometheus.hosts")
