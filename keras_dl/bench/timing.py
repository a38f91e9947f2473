"""How the benchmarks time things: interleaved repeats, medians and spreads, ratios per round.

Every figure is a rate timed over at least :data:`MIN_SECONDS` and repeated at least three times.
The repeats of all paths are interleaved (round 1 of every path, then round 2, ...), so a burst of
background load on this shared machine hits every path, and a ratio taken within one round
compares two paths under the same load. Reports carry the median (the figure to read) and the
min-max spread (how far to trust it), never the best round alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

MIN_SECONDS = 2.0  # each repeat of each figure is timed over at least this long
MIN_ROUNDS = 3


def measure_rounds(rounds: int, paths: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each path's rate in each of ``rounds`` interleaved rounds.

    Args:
        rounds: Repeats of every path.
        paths: Name to a function that measures and returns one rate.

    Returns:
        Name to the list of its rates, one per round, in round order.
    """
    out: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            out[name].append(float(fn()))
    return out


def summarize(
    samples: dict[str, list[float]],
    subjects: tuple[str, ...] = ("keras_dl",),
    scale: float = 1.0,
    unit: str = "rows_per_s",
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
        ([min, max] of the per-round ratios) and ``rounds`` (every sample).
    """
    medians = {n: statistics.median(v) for n, v in samples.items()}
    out = {
        unit: {n: round(m) for n, m in medians.items()},
        "spread": {n: [round(min(v)), round(max(v))] for n, v in samples.items()},
        "mb_per_s": {n: round(m * scale / 1e6, 1) for n, m in medians.items()},
        "ratios": {},
        "ratio_spread": {},
        "rounds": {n: [round(x) for x in v] for n, v in samples.items()},
    }
    for subject in subjects:
        mine = samples.get(subject)
        for name, values in samples.items():
            if name in subjects or mine is None:
                continue
            key = f"{subject}/{name}"
            out["ratios"][key] = round(medians[subject] / medians[name], 3)
            per_round = [a / b for a, b in zip(mine, values) if b > 0]
            out["ratio_spread"][key] = [round(min(per_round), 3), round(max(per_round), 3)]
    return out


def timed_loop(step: Callable[[], int], min_seconds: float | None = None) -> float:
    """Call ``step`` (which returns how many units it did) until ``min_seconds`` passed: units/s.

    The first call is a warm-up and is not counted.
    """
    seconds = MIN_SECONDS if min_seconds is None else min_seconds
    step()
    start, done = time.perf_counter(), 0
    while done == 0 or time.perf_counter() - start < seconds:
        done += step()
    return done / (time.perf_counter() - start)


def consume(ds, steps: int, warmup: int | None = None) -> float:
    """Batches/s of ``ds`` drained by an iterator inside a ``tf.function``, as ``fit`` does.

    Args:
        ds: The dataset (repeating, or at least ``warmup`` + enough batches for
            :data:`MIN_SECONDS`).
        steps: Batches per call of the compiled loop (an epoch, typically).
        warmup: Batches drained first, untimed: tracing, starting readers, filling buffers and
            caches. Defaults to a tenth of ``steps`` (at least 2).
    """
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

    it = iter(ds)
    drain(it, tf.constant(warmup or max(2, steps // 10))).numpy()
    # Whole calls until MIN_SECONDS have passed, so prefetched batches are a small share.
    start, done = time.perf_counter(), 0
    while done == 0 or time.perf_counter() - start < MIN_SECONDS:
        drain(it, tf.constant(steps)).numpy()
        done += steps
    return done / (time.perf_counter() - start)
