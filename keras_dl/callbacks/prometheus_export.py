"""RunMetrics: a run's live figures in Prometheus' text format, served over HTTP or pushed.

Every series is labelled ``run_id``, ``recipe`` and ``rank``; all are gauges but the two
counters:

- ``keras_dl_step``: training steps done (the optimizer's counter, so a resumed run continues);
  ``keras_dl_epoch``: the epoch being trained, from 1;
- ``keras_dl_samples_per_second``, ``keras_dl_input_wait_fraction``,
  ``keras_dl_step_time_seconds``: :class:`~keras_dl.callbacks.Throughput`'s figures of the
  last epoch;
- ``keras_dl_epoch_metric{metric="loss"}``: each numeric value of the last epoch's logs
  (``loss``, ``accuracy``, ``val_loss``, ``val_accuracy``...), Throughput's excepted;
- ``keras_dl_system_<name>``: :class:`~keras_dl.callbacks.SystemSampler`'s last sample
  (``keras_dl_system_cpu_percent``, ``..._rss_bytes``, ``..._read_bytes``,
  ``..._write_bytes``; ``..._gpu_utilization_percent`` and ``..._gpu_memory_used_bytes`` with
  a ``gpu`` label);
- ``keras_dl_last_step_timestamp_seconds`` (Unix time of the rank's last step) and
  ``keras_dl_seconds_since_last_step`` (from it, at the moment of the scrape or push);
- ``keras_dl_running``: 1 while ``fit`` runs, 0 once it ended (finished, failed or preempted);
- ``keras_dl_preemptions_total`` (SIGTERM/SIGINT caught in this ``fit``) and
  ``keras_dl_restarts_total`` (the launcher's automatic restarts of this run so far).

The figures live in plain dicts set by the callback; the registry (one per run, never the
process-global one, so runs in one process do not collide) reads them at each scrape.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
import warnings

from keras_dl.extras import import_extra

log = logging.getLogger(__name__)

PREFIX = "keras_dl_"
LABELS = ("run_id", "recipe", "rank")
_FIGURES = ("progress", "throughput", "epoch_metrics", "system")  # per rank, in snapshots
# Throughput's keys in the epoch logs, and the series they become (with a scale).
THROUGHPUT = {
    "samples_per_sec": ("samples_per_second", 1.0, "Training samples per second, last epoch."),
    "input_wait_fraction": (
        "input_wait_fraction",
        1.0,
        "Share of step time spent waiting for the next batch, last epoch.",
    ),
    "step_time_ms": ("step_time_seconds", 1e-3, "Mean wall time of a training step, last epoch."),
}
NOT_EPOCH_METRICS = {*THROUGHPUT, "steps_per_sec", "input_wait_ms", "rows_trained"}
_GPU = re.compile(r"gpu_(\d+)_(.+)")


class RunMetrics:
    """The figures of one run, per rank, and their exposition.

    Args:
        run_id: The MLflow run id (label ``run_id``).
        recipe: The recipe's name (label ``recipe``).
    """

    def __init__(self, run_id: str, recipe: str):
        import_extra("prometheus_client", "tracking.prometheus_port / prometheus_pushgateway")
        from prometheus_client import CollectorRegistry

        self.run_id, self.recipe = run_id, recipe
        self.progress: dict[int, dict[str, float]] = {}  # rank -> step, epoch, last step time
        self.throughput: dict[int, dict[str, float]] = {}
        self.epoch_metrics: dict[int, dict[str, float]] = {}
        self.system: dict[int, dict[str, float]] = {}
        self.running = 1.0
        self.preemptions = 0
        self.restarts = 0
        self.scraped = threading.Event()  # set by every collection (a scrape or a push)
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server = None
        self._push_warned = False
        # rank -> the host it runs on, for its Pushgateway group (rank 0's: this host's).
        self.hosts: dict[int, str] = {0: socket.gethostname()}

    # -- setting figures (any thread) ---------------------------------------------------------
    def set_progress(self, rank: int, **values: float) -> None:
        with self._lock:
            self.progress.setdefault(rank, {}).update(values)

    def set_epoch(self, rank: int, logs: dict) -> None:
        """Throughput's figures and the metrics of an epoch's logs."""
        numbers = {}
        for key, value in (logs or {}).items():
            try:
                numbers[key] = float(value)
            except (TypeError, ValueError):
                continue
        with self._lock:
            self.throughput[rank] = {k: v for k, v in numbers.items() if k in THROUGHPUT}
            self.epoch_metrics[rank] = {
                k: v for k, v in numbers.items() if k not in NOT_EPOCH_METRICS
            }

    def set_system(self, rank: int, values: dict) -> None:
        with self._lock:
            self.system.setdefault(rank, {}).update(values)

    # -- relaying (rank 0 -> the driver, as JSON) -------------------------------------------
    def snapshot(self) -> dict:
        """Every figure held, as JSON-ready data (ranks as strings), for :meth:`load`."""
        with self._lock:
            figures = {
                name: {str(r): dict(v) for r, v in getattr(self, name).items()} for name in _FIGURES
            }
            hosts = {str(r): h for r, h in self.hosts.items()}
        return {
            **figures,
            "hosts": hosts,
            "running": self.running,
            "preemptions": self.preemptions,
            "restarts": self.restarts,
        }

    def load(self, snapshot: dict) -> None:
        """Take the figures of another process's :meth:`snapshot` (the driver from rank 0);
        what is not a number is left out."""
        with self._lock:
            for name in _FIGURES:
                for r, values in (snapshot.get(name) or {}).items():
                    numbers = {
                        str(k): float(v)
                        for k, v in values.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)
                    }
                    getattr(self, name).setdefault(int(r), {}).update(numbers)
            for r, host in (snapshot.get("hosts") or {}).items():
                self.hosts[int(r)] = str(host)
            for key in ("running", "preemptions", "restarts"):
                if isinstance(snapshot.get(key), (int, float)):
                    setattr(self, key, snapshot[key])

    # -- exposition ---------------------------------------------------------------------------
    def collect(self, rank: int | None = None):
        """The metric families (all ranks, or only ``rank``): the registry calls it."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.scraped.set()
        now = time.time()
        with self._lock:
            progress = {r: dict(v) for r, v in self.progress.items()}
            throughput = {r: dict(v) for r, v in self.throughput.items()}
            epoch_metrics = {r: dict(v) for r, v in self.epoch_metrics.items()}
            system = {r: dict(v) for r, v in self.system.items()}
        ranks = sorted({*progress, *throughput, *epoch_metrics, *system})
        if rank is not None:
            ranks = [r for r in ranks if r == rank]
        families: dict[str, object] = {}

        def add(name, doc, rank_, value, kind=GaugeMetricFamily, **extra):
            key = PREFIX + name
            if key not in families:
                families[key] = kind(key, doc, labels=[*LABELS, *extra])
            families[key].add_metric([self.run_id, self.recipe, str(rank_), *extra.values()], value)

        for r in ranks:
            p = progress.get(r, {})
            for key, doc in (
                ("step", "Training steps done (the optimizer's counter)."),
                ("epoch", "The epoch being trained, from 1."),
            ):
                if key in p:
                    add(key, doc, r, p[key])
            if "last_step" in p:
                add("last_step_timestamp_seconds", "Unix time of the last step.", r, p["last_step"])
                add(
                    "seconds_since_last_step",
                    "Seconds from the last step to this scrape or push.",
                    r,
                    max(now - p["last_step"], 0.0),
                )
            for key, value in throughput.get(r, {}).items():
                name, scale, doc = THROUGHPUT[key]
                add(name, doc, r, value * scale)
            for key, value in epoch_metrics.get(r, {}).items():
                add("epoch_metric", "The last epoch's metrics (loss, val_*).", r, value, metric=key)
            for key, value in system.get(r, {}).items():
                gpu = _GPU.fullmatch(key)
                if gpu:
                    add(f"system_gpu_{gpu[2]}", f"GPU {gpu[2]}.", r, value, gpu=gpu[1])
                else:
                    add(f"system_{key}", f"This rank's {key} (SystemSampler).", r, value)
        if rank in (None, 0):
            add("running", "1 while fit runs, 0 once it ended.", 0, self.running)
            add("preemptions", "SIGTERM/SIGINT caught.", 0, self.preemptions, CounterMetricFamily)
            add("restarts", "Automatic restarts.", 0, self.restarts, CounterMetricFamily)
        return list(families.values())

    def serve(self, port: int, bind: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``bind``:``port`` (0: a free port) from a daemon thread.

        Returns:
            The port it listens on.
        """
        from prometheus_client import start_http_server

        self._server, _thread = start_http_server(port, addr=bind, registry=self.registry)
        return self._server.server_address[1]

    def wait_for_scrape(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the endpoint to be scraped once more (the final
        values); True when it was."""
        if self._server is None or timeout <= 0:
            return False
        self.scraped.clear()
        return self.scraped.wait(timeout)

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def push(self, gateway: str, job: str = "keras_dl", timeout: float = 5.0) -> bool:
        """Push each rank's series to ``gateway`` in its own group: job/run_id/rank/host (the
        host from :attr:`hosts`, "unknown" for a rank it lacks).

        A gateway that fails is warned about once and never stops training.

        Returns:
            True when every group was pushed.
        """
        from prometheus_client import push_to_gateway

        with self._lock:
            ranks = sorted({*self.progress, *self.throughput, *self.epoch_metrics, *self.system})
        try:
            for rank in ranks or [0]:
                push_to_gateway(
                    gateway,
                    job=job,
                    registry=_OneRank(self, rank),
                    grouping_key={
                        "run_id": self.run_id,
                        "rank": str(rank),
                        "host": self.hosts.get(rank, "unknown"),
                    },
                    timeout=timeout,
                )
        except Exception as exc:  # noqa: BLE001 - monitoring never ends a run
            if not self._push_warned:
                self._push_warned = True
                warnings.warn(
                    f"Prometheus: pushing run {self.run_id}'s metrics to "
                    f"tracking.prometheus_pushgateway={gateway!r} failed ({exc}); training goes "
                    "on, later pushes are tried at each epoch end.",
                    stacklevel=2,
                )
            return False
        return True


class _OneRank:
    """A registry view of one rank's series, for its Pushgateway group."""

    def __init__(self, metrics: RunMetrics, rank: int):
        self.metrics, self.rank = metrics, rank

    def collect(self):
        return self.metrics.collect(rank=self.rank)
