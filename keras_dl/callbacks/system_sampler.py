"""SystemSampler: this process's CPU, memory, disk I/O and GPU use, read every N seconds.

It reads once when started, every ``interval`` seconds from a daemon thread, and once more when
stopped, so a run shorter than the interval still has a first and a last sample:

- ``cpu_percent``: this process's CPU use since the last sample (the first: since the process
  started), in percent of one core (all its threads: 150 means one and a half cores busy);
- ``rss_bytes``: its resident memory;
- ``read_bytes`` / ``write_bytes``: bytes it read from and wrote to storage since ``start``;
- ``gpu_<i>_utilization_percent`` / ``gpu_<i>_memory_used_bytes`` for each GPU it may use,
  only when NVIDIA's management library answers: ``nvidia-ml-py`` (``import pynvml``) is
  imported lazily, and when it is missing or finds no driver the GPU figures are simply absent
  (:attr:`SystemSampler.gpu_status` says why).

Each sample goes to ``deliver(step, timestamp_ms, values)`` (from the sampling thread) or, with
no ``deliver``, to a buffer that :meth:`SystemSampler.drain` empties. The thread is a daemon
and owns nothing outside the process, so a killed process leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

BASE_NAMES = ("cpu_percent", "rss_bytes", "read_bytes", "write_bytes")
MAX_GPUS = 16
GPU_FIELDS = ("utilization_percent", "memory_used_bytes")
# Every name a sample may hold, in a fixed order: samples cross ranks as (name index, value).
NAMES = BASE_NAMES + tuple(f"gpu_{i}_{f}" for i in range(MAX_GPUS) for f in GPU_FIELDS)

Sample = tuple[int, int, dict[str, float]]  # (step, timestamp in ms, {name: value})


class SystemSampler:
    """Sample this process's resource use from a background thread.

    Args:
        interval: Seconds between samples (> 0).
        deliver: Called with ``(step, timestamp_ms, values)`` for each sample, from the
            sampling thread; None keeps the samples for :meth:`drain`. Defaults to None.
    """

    def __init__(self, interval: float, deliver: Callable[[int, int, dict], None] | None = None):
        self.interval = float(interval)
        self.deliver = deliver
        self.gpu_status = "not started"
        self._buffer: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Take the first sample now, and start sampling every interval. Idempotent."""
        if self.running:
            return
        import psutil

        self._process = psutil.Process()
        self._process.cpu_percent(None)  # primes the counter: the next sample covers from now
        self._io0 = _io_bytes(self._process)
        self._gpus, self.gpu_status = _open_gpus()
        self._failed = False
        self._take(_since_start(self._process))
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="SystemSampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0, last_sample: bool = True) -> None:
        """Stop the thread and wait for it (a sample being taken finishes first), then take the
        last sample (unless ``last_sample`` is False, or sampling failed). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            joined = not self._thread.is_alive()
            self._thread = None
            if last_sample and joined and not self._failed:
                self._take()
        if getattr(self, "_gpus", None):
            _close_nvml()
            self._gpus = []

    def drain(self) -> list[Sample]:
        """The samples kept since the last call (none when ``deliver`` takes them)."""
        with self._lock:
            out, self._buffer = self._buffer, []
        return out

    def sample(self, cpu_percent: float | None = None) -> dict[str, float]:
        """Read the figures now (also what the thread does every interval); ``cpu_percent``
        given replaces the CPU use since the last sample."""
        p = self._process
        cpu = p.cpu_percent(None) if cpu_percent is None else cpu_percent
        values = {"cpu_percent": cpu, "rss_bytes": float(p.memory_info().rss)}
        io = _io_bytes(p)
        if io is not None and self._io0 is not None:
            values["read_bytes"] = float(io[0] - self._io0[0])
            values["write_bytes"] = float(io[1] - self._io0[1])
        for i, handle in self._gpus:
            values.update(_gpu_values(i, handle))
        return values

    # -- the thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval) and self._take():
            pass

    def _take(self, cpu_percent: float | None = None) -> bool:
        """Take one sample and hand it on; False (and no more samples) when sampling failed."""
        try:
            values = self.sample(cpu_percent)
        except Exception as exc:  # a sampler must never take training down
            log.warning("SystemSampler: sampling failed (%s); no more samples.", exc)
            self._failed = True
            return False
        with self._lock:
            step, self._step = self._step, self._step + 1
        stamp = int(time.time() * 1000)
        if self.deliver is not None:
            self.deliver(step, stamp, values)
        else:
            with self._lock:
                self._buffer.append((step, stamp, values))
        return True


def _since_start(process) -> float:
    """The process's CPU use since it started, in percent of one core."""
    cpu = process.cpu_times()
    alive = max(time.time() - process.create_time(), 1e-3)
    return 100.0 * (cpu.user + cpu.system) / alive


def _io_bytes(process) -> tuple[int, int] | None:
    try:
        io = process.io_counters()
    except (AttributeError, OSError):  # platforms without per-process I/O counters
        return None
    return io.read_bytes, io.write_bytes


def _open_gpus() -> tuple[list, str]:
    """NVML handles of the GPUs this process may use, and a line saying what was found."""
    try:
        import pynvml
    except ImportError:
        return [], "no GPU figures: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        indexes = _visible_gpu_indexes(count)
        gpus = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indexes[:MAX_GPUS]]
    except pynvml.NVMLError as exc:
        return [], f"no GPU figures: NVML did not start ({exc})"
    if not gpus:
        _close_nvml()
        return [], "no GPU figures: NVML sees no GPU for this process"
    return gpus, f"GPU figures for GPU(s) {[i for i, _ in gpus]}"


def _visible_gpu_indexes(count: int) -> list[int]:
    """NVML numbers every GPU of the host; CUDA_VISIBLE_DEVICES (set per Spark task or rank)
    says which of them this process trains on, when it lists plain indexes."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if all(p.isdigit() for p in parts):
        return [int(p) for p in parts if int(p) < count]
    return list(range(count))  # UUIDs or MIG names: report every GPU rather than guess


def _gpu_values(index: int, handle) -> dict[str, float]:
    import pynvml

    try:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except pynvml.NVMLError:
        return {}
    return {
        f"gpu_{index}_utilization_percent": float(util),
        f"gpu_{index}_memory_used_bytes": float(used),
    }


def _close_nvml() -> None:
    import pynvml

    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass
