"""What Petastorm's reader machinery costs, and who spends the streaming path's CPU.

Both run keras_dl's training pipeline (streaming, shuffled, as ``fit`` gets it) over a table:

- :func:`reader_machinery`: the pipeline with its reads through Petastorm's ``Reader`` (its
  ventilator, thread pool and results queues), interleaved with the same pipeline reading
  through a plain ``ThreadPoolExecutor`` that runs the same loading and conversion
  (:func:`keras_dl.data.stream.row_group_worker.load_and_convert`), on as many threads, in the same
  order, as far ahead. Their ratio is what the machinery costs.
- :func:`thread_cpu`: the process's CPU per row in one timed window, split by who spent it:
  the reader's worker threads loading and converting row groups (decoding, page checksums,
  the table's types, numpy and packing), the generator that feeds tf.data (the row shuffle's
  gather, cutting blocks of batches), and the rest (Arrow's decoding pool, which pyarrow hands
  part of each row group to; tf.data's hand-over and slicing; Petastorm's queues; the consumer).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks import timing
from benchmarks.input_paths import consume_split, keras_dl_dataset

AHEAD_PER_WORKER = 3  # row groups in flight per worker, as Petastorm's ventilator allows


def reader_machinery(path: str, batch: int, rounds: int, pack: bool = False) -> dict:
    """Rows/s and CPU per row of the streaming pipeline through Petastorm's reader and through
    a plain thread pool doing the same work, interleaved, with keras_dl's ratio to the pool."""
    paths = {
        "petastorm_reader": lambda: _rate(path, batch, pack, plain=False),
        "plain_thread_pool": lambda: _rate(path, batch, pack, plain=True),
    }
    cpu: dict = {}
    samples = timing.measure_rounds(rounds, paths, cpu)
    return timing.summarize(samples, subjects=("petastorm_reader",), cpu=cpu)


def thread_cpu(path: str, batch: int, pack: bool = False) -> dict:
    """The streaming pipeline's CPU in microseconds per row over one timed window (at least
    ``timing.MIN_SECONDS``), by who spent it, and the cores it kept busy.

    The reader workers' loading and conversion and the generator's steps are timed by their
    own threads' CPU clocks; the other threads by ``/proc`` (Linux): those tf.data runs the
    generator on (what else they spent is the hand-over: numpy to tensors, the blocks' slicing),
    TensorFlow's executors and the consumer, and the native pools (Arrow decodes part of each
    row group on its own). ``rest``: what no thread alive at the window's end accounts for
    (the reader's threads beyond the row groups' work: Petastorm's queues and ventilator).
    """
    import os

    spent: collections.Counter = collections.Counter()
    threads: dict[str, set] = collections.defaultdict(set)
    before: dict = {}

    def started() -> None:  # the timed window opens: the warm-up's CPU is not counted
        spent.clear()
        before.update(_per_thread())

    split = keras_dl_dataset(path, batch, None, pack=pack, stream=_counted(spent, threads))
    steps, wall, total = timing.drain_window(split.dataset, split.steps, started=started)
    after, counted = _per_thread(), dict(spent)
    seconds = collections.Counter(
        reader_workers_load_and_convert=counted.get("load_and_convert", 0.0),
        generator_shuffle_and_blocks=counted.get("generator", 0.0),
    )
    for tid, (comm, t) in after.items():
        delta = t - before.get(tid, (comm, 0.0))[1]
        if tid in threads["load_and_convert"]:
            continue  # timed above, by the row group
        if tid in threads["generator"]:
            seconds["tfdata_generator_threads_handover"] += delta
        elif tid == os.getpid() or comm.startswith("tf_"):
            seconds["tensorflow_executors_and_consumer"] += delta
        else:
            seconds["native_pools_arrow_decode"] += delta
    seconds["tfdata_generator_threads_handover"] -= seconds["generator_shuffle_and_blocks"]
    seconds["rest"] = total - sum(seconds.values())
    rows = steps * split.rows / split.steps
    return {
        "rows_per_s": round(rows / wall),
        "cpu_us_per_row": {k: round(1e6 * v / rows, 3) for k, v in seconds.items()},
        "cpu_us_per_row_total": round(1e6 * total / rows, 3),
        "busy_cores": round(total / wall, 2),
    }


def _per_thread() -> dict[int, tuple[str, float]]:
    """Each live thread of this process: its name and CPU seconds (empty off Linux)."""
    import os

    out = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
                with open(f"/proc/self/task/{tid}/comm") as f:
                    comm = f.read().strip()
                fields = stat[stat.rindex(")") + 2 :].split()  # utime, stime: fields 14, 15
                out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _rate(path: str, batch: int, pack: bool, plain: bool) -> float:
    stream = _plain_stream if plain else None
    return consume_split(keras_dl_dataset(path, batch, None, pack=pack, stream=stream), batch)


def _plain_stream(*args):
    """keras_dl's stream (``make_dataset``'s arguments), reading its row groups through
    :func:`plain_reads`."""
    from keras_dl.data.hooks import EpochStream

    return EpochStream(*args, reads=plain_reads)


def plain_reads(
    snapshot, columns, pieces, workers=2, what=(0, 1), convert=None, near_end=None, io=None
):
    """``read_pieces`` without Petastorm: ``(piece, converted value)`` in order, each row group
    loaded and converted on a ``ThreadPoolExecutor`` of ``workers`` threads, at most
    ``AHEAD_PER_WORKER`` per worker in flight; ``near_end`` called as ``read_pieces`` calls it.
    For the comparison only: it skips the row count checks ``read_pieces`` makes, and reads
    local tables only (``io``, how a remote one is fetched ahead, does not apply)."""
    from keras_dl.data.hooks import Converted, load_and_convert, row_group_loader

    load = row_group_loader(
        snapshot, tuple(columns), {(p.file, p.row_group): p.keep for p in pieces}
    )
    last = max(len(pieces) - max(workers, 1), 0)
    with ThreadPoolExecutor(workers) as pool:

        def submit(piece):
            return piece, pool.submit(load_and_convert, load, convert, piece.file, piece.row_group)

        queued = iter(pieces)
        flight = collections.deque(
            map(submit, itertools.islice(queued, AHEAD_PER_WORKER * workers))
        )
        done = 0
        while flight:
            if done == last and near_end is not None:
                near_end()
            piece, future = flight.popleft()
            result = future.result()
            flight.extend(map(submit, itertools.islice(queued, 1)))
            done += 1
            if result is None:  # no rows: as Petastorm's reader, nothing is handed on
                continue
            if not isinstance(result, Converted):
                yield piece, result
            elif result.error is not None:
                raise result.error
            else:
                yield piece, result.value


def _counted(spent: collections.Counter, threads: dict):
    """How ``make_dataset`` makes the stream for :func:`thread_cpu`: keras_dl's own, but the
    CPU each thread spends in the reader workers' loading and conversion, and in the stream's
    generator, is added to ``spent`` (seconds), and the threads' native ids to ``threads``."""
    from keras_dl.data.hooks import EpochStream, load_and_convert, read_pieces

    lock = threading.Lock()

    def add(key: str, start: float) -> None:
        with lock:
            spent[key] += time.thread_time() - start
            threads[key].add(threading.get_native_id())

    def counted_load(*args):
        start = time.thread_time()
        try:
            return load_and_convert(*args)
        finally:
            add("load_and_convert", start)

    def counted_blocks(blocks):
        try:
            while True:
                start = time.thread_time()  # each step runs on the thread tf.data calls it on
                try:
                    block = next(blocks)
                except StopIteration:
                    return
                finally:
                    add("generator", start)
                yield block
        finally:
            blocks.close()

    class CountedStream(EpochStream):
        def generate(self):
            return counted_blocks(super().generate())

    reads = functools.partial(read_pieces, load=counted_load)
    return lambda *args: CountedStream(*args, reads=reads)
