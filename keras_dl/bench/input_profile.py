"""Where keras_dl's input pipeline spends its time: a stage profile and a Python profile.

- :func:`profile_stages`: rows/s of the pipeline cut after each stage (reader, casts, row
  shuffle, handing blocks of batches to tf.data, slicing them), each timed like the others.
- :func:`profile_generator`: cProfile of the Python generator that feeds tf.data, run in this
  thread (tf.data runs it on its own threads, where a profiler in this one sees nothing).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import numpy as np

from keras_dl.bench.input_paths import reader_alone
from keras_dl.bench.timing import MIN_SECONDS, consume, timed_loop

TOP_FUNCTIONS = 12


def profile_stages(path: str, batch: int) -> dict[str, float]:
    """Rows/s of keras_dl's pipeline cut after each stage, to show where the time goes.

    reader: Petastorm's batch reader alone; +convert: plus keras_dl's per-row-group casts;
    +shuffle: plus the in-memory row shuffle; +from_generator: plus handing the arrays to
    tf.data as blocks of whole batches; +slice: plus slicing the blocks into batches (the whole
    training pipeline but the final prefetch).
    """
    import tensorflow as tf

    from keras_dl.data import open_table, plan_columns
    from keras_dl.data.blocks import cut_blocks
    from keras_dl.data.signature import input_signature, to_structure
    from keras_dl.data.tfdata import make_dataset  # noqa: F401  (the pipeline profiled)

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), None)
    out = {
        "reader": reader_alone(snapshot),
        "+convert": _python_rate(_groups(snapshot, plan)),
        "+shuffle": _python_rate(_shuffled(snapshot, plan)),
    }
    spec = input_signature(plan, blocked=True)

    def gen():
        carry = None
        for arrays in _shuffled(snapshot, plan):
            blocks, carry = cut_blocks(arrays, carry, batch)
            if blocks is not None:
                yield to_structure(blocks, plan)

    ds = tf.data.Dataset.from_generator(gen, output_signature=spec).prefetch(2)
    group_rows = int(np.mean([r.num_rows for r in _row_groups(snapshot)]))
    out["+from_generator"] = consume(ds, 50) * group_rows  # about a row group per block
    steps = max(1, 4 * group_rows // batch)
    slices = ds.flat_map(tf.data.Dataset.from_tensor_slices)
    out["+slice"] = consume(slices, steps) * batch
    return {k: round(v) for k, v in out.items()}


def profile_generator(path: str, seconds: float | None = None) -> dict:
    """cProfile of keras_dl's generator (read, convert, shuffle) over about ``seconds``.

    Returns:
        ``rows_per_s`` under the profiler, and the top functions by own time, each with its
        share of the profiled time.
    """
    from keras_dl.data import open_table, plan_columns

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), None)
    it = _shuffled(snapshot, plan)
    next(it)  # reader start-up is not steady state
    budget = MIN_SECONDS if seconds is None else seconds
    profiler, rows = cProfile.Profile(), 0
    start = time.perf_counter()
    profiler.enable()
    while time.perf_counter() - start < budget:
        rows += len(next(iter(next(it).values())))
    profiler.disable()
    elapsed = time.perf_counter() - start
    it.close()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    total = sum(v[2] for v in stats.stats.values()) or 1e-9  # own (total) time of every function
    top = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP_FUNCTIONS]
    return {
        "rows_per_s": round(rows / elapsed),
        "top_own_time": [
            {
                "function": f"{_short(file)}:{line}({name})",
                "calls": calls,
                "own_share": round(own / total, 3),
            }
            for (file, line, name), (_, calls, own, _, _) in top
        ],
    }


def _groups(snapshot, plan):
    """Epochs without end, each one exact, as training reads them."""
    from keras_dl.data.reader import iter_epoch_arrays
    from keras_dl.data.rows import scan_table

    stats = scan_table(snapshot, plan.columns)
    epoch = 0
    while True:
        yield from iter_epoch_arrays(snapshot, plan, stats, shuffle=True, seed=epoch)
        epoch += 1


def _shuffled(snapshot, plan):
    from keras_dl.data.reader import shuffle_rows

    return shuffle_rows(_groups(snapshot, plan), 4096, 0)


def _python_rate(it) -> float:
    return timed_loop(lambda: len(next(iter(next(it).values()))), MIN_SECONDS / 2)


def _row_groups(snapshot):
    import pyarrow.parquet as pq

    for path in snapshot.files:
        meta = pq.ParquetFile(path).metadata
        for i in range(meta.num_row_groups):
            yield meta.row_group(i)


def _short(file: str) -> str:
    """The path from the package folder on (site-packages/... is noise)."""
    for marker in ("site-packages/", "keras_dl/"):
        if marker in file:
            return file[file.index(marker) + (len(marker) if marker == "site-packages/" else 0) :]
    return file
