"""Where keras_dl's input pipeline spends its time: a stage profile and a Python profile.

Both drive the pipeline's own :class:`~keras_dl.data.stream.epoch_stream.EpochStream` through its public
methods, so what is profiled is what training runs.

- :func:`profile_stages`: rows/s of the pipeline cut after each stage (reader, casts, row
  shuffle, handing blocks of batches to tf.data, slicing them), each timed like the others.
- :func:`profile_generator`: cProfile of the Python generator that feeds tf.data, run in this
  thread (tf.data runs it on its own threads, where a profiler in this one sees nothing).
"""

from __future__ import annotations

import cProfile
import io
import itertools
import pstats
import time

import numpy as np

from benchmarks import timing
from benchmarks.input_paths import reader_alone
from benchmarks.timing import consume, timed_loop

TOP_FUNCTIONS = 12
SHUFFLE_BUFFER = 4096  # rows mixed in memory, as data.shuffle_buffer's default


def profile_stages(path: str, batch: int, pack: bool = False) -> dict[str, float]:
    """Rows/s of keras_dl's pipeline cut after each stage, to show where the time goes.

    reader: Petastorm's batch reader alone; +convert: keras_dl's reads of shuffled row groups,
    cast per row group (the stream's epochs without the row shuffle); +shuffle: plus the
    in-memory row shuffle; +from_generator: plus handing the arrays to tf.data as blocks of
    whole batches (the stream's generator); +slice: plus slicing the blocks into batches (the
    whole training pipeline but the final prefetch).

    Args:
        pack: Profile the pipeline with ``data.pack_features`` (one ``(B, k)`` tensor per dtype).
    """
    import tensorflow as tf

    from keras_dl.data import open_table, plan_columns
    from keras_dl.data.hooks import guard_generator

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), None, pack=pack)
    out = {"reader": reader_alone(snapshot)}
    for stage, buffer in (("+convert", 0), ("+shuffle", SHUFFLE_BUFFER)):
        stream = _stream(snapshot, plan, batch, buffer)
        out[stage] = _python_rate(_chunks(stream))
        stream.close()
    stream = _stream(snapshot, plan, batch)
    generate = guard_generator(stream.generate)  # as tf.data is handed it
    ds = tf.data.Dataset.from_generator(generate, output_signature=stream.signature).prefetch(2)
    group_rows = int(np.mean([r.num_rows for r in _row_groups(snapshot)]))
    out["+from_generator"] = consume(ds, 50) * group_rows  # about a row group per block
    steps = max(1, 4 * group_rows // batch)
    slices = ds.flat_map(tf.data.Dataset.from_tensor_slices)
    out["+slice"] = consume(slices, steps) * batch
    return {k: round(v) for k, v in out.items()}


def profile_generator(path: str, seconds: float | None = None) -> dict:
    """cProfile of keras_dl's generator (read, convert, shuffle, cut into blocks) over about
    ``seconds``; the next epoch's reader, opened ahead on its own thread, is not in it.

    Returns:
        ``rows_per_s`` under the profiler, and the top functions by own time, each with its
        share of the profiled time.
    """
    from keras_dl.data import open_table, plan_columns

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), None)
    it = _stream(snapshot, plan, 256).generate()
    next(it)  # reader start-up is not steady state
    # timing.MIN_SECONDS as the run set it (--quick lowers it), not as it was at import
    budget = timing.MIN_SECONDS if seconds is None else seconds
    profiler, rows = cProfile.Profile(), 0
    start = time.perf_counter()
    profiler.enable()
    while time.perf_counter() - start < budget:
        rows += _block_rows(next(it))
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


def _stream(snapshot, plan, batch: int, buffer: int = SHUFFLE_BUFFER):
    """The training stream of one shard, read from the table every epoch (no memory cache)."""
    from keras_dl.data import ReadOptions
    from keras_dl.data.hooks import EpochStream

    return EpochStream(snapshot, plan, ReadOptions(batch, training=True, shuffle_buffer=buffer))


def _chunks(stream):
    """Epochs without end, each one exact, as training reads them (before the blocks)."""
    for epoch in itertools.count():
        yield from stream.chunks(epoch)


def _block_rows(block) -> int:
    first = next(iter(block.values())) if isinstance(block, dict) else block
    return int(first.shape[0] * first.shape[1])  # (batches, rows per batch, ...)


def _python_rate(it) -> float:
    return timed_loop(lambda: len(next(iter(next(it).values()))), timing.MIN_SECONDS / 2)


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
