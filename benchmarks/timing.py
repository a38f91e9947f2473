"""How the benchmarks time things: interleaved repeats, medians and spreads, ratios per round.

Every figure is a rate timed over at least :data:`MIN_SECONDS` and repeated at least three times.
The repeats of all paths are interleaved (round 1 of every path, then round 2, ...), so a burst of
background load on this shared machine hits every path, and a ratio taken within one round
compares two paths under the same load. Reports carry the median (the figure to read) and the
min-max spread (how far to trust it), never the best round alone.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

MIN_SECONDS = 2.0  # each repeat of each figure is timed over at least this long
MIN_ROUNDS = 3
PER_SECOND = 10_000  # the feed rate ``cores_per_10k_per_s`` is given for
# CPU seconds this process spent (all threads) per wall second of the last timed window:
# divided by the rate it returned, the CPU cost of one unit, which other people's load on a
# shared machine moves much less than the wall time.
_last_utilization: float | None = None
_descendants = False  # also count the CPU of this process's descendants (Ray's workers)
# Within counting_descendants: each descendant seen, (pid, start time), to its CPU when last seen.
_seen: dict[tuple[int, float], float] = {}


def measure_rounds(
    rounds: int, paths: dict[str, Callable[[], float]], cpu: dict | None = None
) -> dict[str, list[float]]:
    """Each path's rate in each of ``rounds`` interleaved rounds.

    Args:
        rounds: Repeats of every path.
        paths: Name to a function that measures and returns one rate (through
            :func:`timed_loop` or :func:`consume`).
        cpu: When given, filled with name to the list of its CPU microseconds per unit (all of
            this process's threads, over the timed window), one per round.

    Returns:
        Name to the list of its rates, one per round, in round order.
    """
    global _last_utilization
    out: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            _last_utilization = None
            rate = float(fn())
            out[name].append(rate)
            if cpu is not None and _last_utilization is not None and rate > 0:
                cpu.setdefault(name, []).append(1e6 * _last_utilization / rate)
    return out


def cpu_seconds() -> float:
    """CPU seconds of this process, all threads; within :func:`counting_descendants`, plus
    those of every descendant process seen in the block (Ray's workers).

    Never decreases within the block: a descendant that has exited keeps the CPU it had when
    last seen (summing only the live ones made a worker's exit a negative CPU per row).
    """
    import os

    t = os.times()
    own = t.user + t.system
    if not _descendants:
        return own
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            _seen[(child.pid, child.create_time())] = c.user + c.system
    return own + sum(_seen.values())


@contextlib.contextmanager
def counting_descendants() -> Iterator[None]:
    """Within the block, CPU figures also count every live descendant process's CPU.

    For paths whose work runs in other processes (Ray's workers): without it their CPU per row
    would count only the driver's share. A descendant's CPU after it was last seen (it exits
    within a timed window), or of one that starts and exits between two readings, is not
    counted, which can only flatter that path.
    """
    global _descendants
    _seen.clear()
    _descendants = True
    try:
        yield
    finally:
        _descendants = False
        _seen.clear()


def _record(cpu_start: float, wall_start: float) -> None:
    global _last_utilization
    wall = time.perf_counter() - wall_start
    _last_utilization = (cpu_seconds() - cpu_start) / wall if wall > 0 else None


def summarize(
    samples: dict[str, list[float]],
    subjects: tuple[str, ...] = ("keras_dl",),
    scale: float = 1.0,
    unit: str = "rows_per_s",
    cpu: dict[str, list[float]] | None = None,
) -> dict:
    """Medians, spreads and each subject's ratio to every other path.

    Args:
        samples: Name to its per-round rates (as :func:`measure_rounds` returns them).
        subjects: The paths whose ratios to every other path are reported (as numerators).
            Defaults to ("keras_dl",).
        scale: Bytes per unit, for the ``mb_per_s`` figures. Defaults to 1.0.
        unit: The key of the medians. Defaults to "rows_per_s".

    Returns:
        ``rows_per_s`` (medians, or under ``unit``), ``spread`` ([min, max] per path), ``mb_per_s`` (medians),
        ``ratios`` (median of the subject over median of the baseline), ``ratio_spread``
        ([min, max] of the per-round ratios) and ``rounds`` (every sample); with ``cpu``
        (from :func:`measure_rounds`), ``cpu_us_per_unit`` (medians), ``cpu_spread``,
        ``cpu_ratios`` (each subject's CPU per unit over each other path's: lower is cheaper)
        and ``cores_per_10k_per_s`` (CPU cores busy to feed 10,000 units a second).
    """
    medians = {n: statistics.median(v) for n, v in samples.items()}
    out = {
        unit: {n: _rate(m) for n, m in medians.items()},
        "spread": {n: [_rate(min(v)), _rate(max(v))] for n, v in samples.items()},
        "mb_per_s": {n: _significant(m * scale / 1e6) for n, m in medians.items()},
        "ratios": {},
        "ratio_spread": {},
        "rounds": {n: [_rate(x) for x in v] for n, v in samples.items()},
    }
    for subject in subjects:
        mine = samples.get(subject)
        for name, values in samples.items():
            if name in subjects or mine is None:
                continue
            key = f"{subject}/{name}"
            out["ratios"][key] = ratio(medians[subject], medians[name])
            out["ratio_spread"][key] = ratio_spread(mine, values)
    if cpu:
        cpu_medians = {n: statistics.median(v) for n, v in cpu.items()}
        out["cpu_us_per_unit"] = {n: round(m, 2) for n, m in cpu_medians.items()}
        out["cpu_spread"] = {n: [round(min(v), 2), round(max(v), 2)] for n, v in cpu.items()}
        # What a buyer sizes a node by: CPU cores busy to feed 10,000 units (rows, images) a second.
        out["cores_per_10k_per_s"] = {
            n: round(m * PER_SECOND / 1e6, 3) for n, m in cpu_medians.items()
        }
        out["cpu_ratios"] = {
            f"{subject}/{name}": round(cpu_medians[subject] / m, 3)
            for subject in subjects
            if subject in cpu_medians
            for name, m in cpu_medians.items()
            if name not in subjects and m > 0
        }
    return out


def ratio(mine: float, theirs: float) -> float | None:
    """``mine / theirs`` to 3 places, or None when the baseline measured 0 (a peer that did no
    work in its rounds): a target judges None as missed and prints it as ``n/a``."""
    return round(mine / theirs, 3) if theirs > 0 else None


def ratio_spread(mine: list[float], theirs: list[float]) -> list[float]:
    """[min, max] of the per-round ratios, over the rounds whose baseline is above 0; [] if none."""
    per_round = [a / b for a, b in zip(mine, theirs) if b > 0]
    return [round(min(per_round), 3), round(max(per_round), 3)] if per_round else []


def judged(value: float | None, minimum: float, places: int = 2) -> tuple[float | None, bool]:
    """A ratio as a target prints and judges it: to ``places`` (a 0.8996 shown as 0.9 meets 0.9);
    one that could not be measured (None) stays None, JSON's null, and is missed."""
    if value is None:
        return None, False
    value = round(value, places)
    return value, value >= minimum


def _rate(x: float) -> float:
    """A rate as printed: whole units from 100 a second up, else 3 significant figures, so a
    slow path's rate (a peer stalled on a loaded machine: 0.4 samples/s) never prints as 0."""
    return round(x) if abs(x) >= 100 else _significant(x)


def _significant(x: float, digits: int = 3) -> float:
    """``x`` to ``digits`` significant figures: a slow path's small MB/s stays above zero."""
    return float(f"{x:.{digits}g}")


def timed_loop(step: Callable[[], int], min_seconds: float | None = None) -> float:
    """Call ``step`` (which returns how many units it did) until ``min_seconds`` passed: units/s.

    The first call is a warm-up and is not counted.
    """
    seconds = MIN_SECONDS if min_seconds is None else min_seconds
    step()
    cpu, start, done = cpu_seconds(), time.perf_counter(), 0
    while done == 0 or time.perf_counter() - start < seconds:
        done += step()
    rate = done / (time.perf_counter() - start)
    _record(cpu, start)
    return rate


def consume(ds, steps: int, warmup: int | None = None) -> float:
    """Batches/s of ``ds`` drained by an iterator inside a ``tf.function``, as ``fit`` does.

    Args:
        ds: The dataset (repeating, or at least ``warmup`` + enough batches for
            :data:`MIN_SECONDS`).
        steps: Batches per call of the compiled loop (an epoch, typically).
        warmup: Batches drained first, untimed: tracing, starting readers, filling buffers and
            caches. Defaults to a tenth of ``steps`` (at least 2).
    """
    global _last_utilization
    done, wall, cpu = drain_window(ds, steps, warmup)
    _last_utilization = cpu / wall if wall > 0 else None
    return done / wall


def drain_window(ds, steps: int, warmup: int | None = None, started=None):
    """Drain ``ds`` as :func:`consume` does; return the timed window's ``(batches, wall
    seconds, CPU seconds)``. ``started()`` is called as the window opens, after the warm-up."""
    import tensorflow as tf

    drain = _drainer()
    it = iter(ds)
    drain(it, tf.constant(warmup or max(2, steps // 10))).numpy()
    if started is not None:
        started()
    # Whole calls until MIN_SECONDS have passed, so prefetched batches are a small share.
    cpu, start, done = cpu_seconds(), time.perf_counter(), 0
    while done == 0 or time.perf_counter() - start < MIN_SECONDS:
        drain(it, tf.constant(steps)).numpy()
        done += steps
    return done, time.perf_counter() - start, cpu_seconds() - cpu


def _drainer():
    """``drain(iterator, n)``: a ``tf.function`` taking ``n`` elements of ``iterator``, as
    ``fit``'s loop does (each path's own trace: a new function per call of this)."""
    import tensorflow as tf

    @tf.function
    def drain(iterator, n):
        acc = tf.constant(0.0)
        for _ in tf.range(n):
            # get_next produces every component; touching the first keeps the step cheap and
            # the same for every path.
            parts = tf.nest.flatten(next(iterator))
            first = next((t for t in parts if t.dtype != tf.string), None)
            if first is None:
                first = tf.strings.length(parts[0])
            acc += tf.cast(tf.reshape(first, [-1])[0], tf.float32)
        return acc

    return drain


def format_targets(targets: list[dict]) -> str:
    """Targets as a plain-text table: table and batch (when they have them), ratio, median (``n/a``
    when its baseline measured 0), spread, target, pass/fail, and the pair's CPU-per-row ratio
    (when measured)."""
    where = any("table" in t for t in targets)
    lines = [
        f"{'table':8s} {'batch':>5s}  " * where
        + f"{'ratio':42s} {'median':>7s}  {'spread':15s} target        cpu/row ratio"
    ]
    for t in targets:
        spread = "-".join(str(x) for x in t.get("spread", [])) or "-"
        cpu = t.get("cpu_ratio")
        lines.append(
            f"{t.get('table', ''):8s} {str(t.get('batch', '')):>5s}  "
            * where
            + f"{t['ratio']:42s} {'n/a' if t['value'] is None else t['value']:>7}  "
            f"{spread:15s} {t['target']!s:6s} "
            f"{'pass' if t['met'] else 'FAIL':4s}  {'' if cpu is None else cpu}"
        )
    return "\n".join(lines)
