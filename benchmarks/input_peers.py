"""The peers ``keras-dl bench input`` sets keras_dl beside: what a user would pick instead of it.

Each reads the same table files, at the same batch size, one pass per epoch:

- ``ray_to_tf``: Ray Data, ``read_parquet(files, shuffle="files").to_tf(...)`` with a local
  shuffle buffer of :data:`RAY_SHUFFLE_ROWS` rows: Ray's Keras path, a ``tf.data.Dataset``
  drained the way ``fit`` drains one.
- ``ray_iter``: the same Ray dataset's ``iter_tf_batches``, iterated in Python: Ray's faster
  path (no tf.data in between), so the comparison is fair to Ray.
- ``hand_written``: the pipeline a user writes without a loader: pyarrow ``iter_batches`` over
  the files (in a new order each epoch) into ``tf.data.Dataset.from_generator``. No row shuffle.
- ``in_memory_permuted``: the fair baseline of keras_dl's cache: the whole table as tensors in
  memory, a new permutation of every row each epoch, gathered a block at a time and cut into
  batches, as keras_dl's cache serves an epoch.

None of the peers reads a Delta log: they take the snapshot's file list as given, so none of
them would drop rows a deletion vector deletes (the bench tables have none). Ray runs in its
own processes; their CPU is counted with this process's
(:func:`benchmarks.timing.counting_descendants`).
"""

from __future__ import annotations

import contextlib
import logging
import os

import numpy as np

from benchmarks.timing import consume, counting_descendants, timed_loop

RAY_SHUFFLE_ROWS = 4096  # Ray's local shuffle buffer, as its docs' examples use it
RAY_OBJECT_STORE_BYTES = 1 << 30
RAY_MISSING = (
    "Ray Data is not installed: `pip install 'keras-dl[bench]'` (make setup installs it), "
    "or leave Ray out with `--no-ray`."
)


@contextlib.contextmanager
def ray_session():
    """A local Ray of this machine's CPUs for the Ray paths; shut down on exit.

    Raises:
        RuntimeError: Ray is not installed (names the extra that brings it).
    """
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError(RAY_MISSING) from exc
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Ray starts its workers at nice 15; keras_dl and the other feeds run at this process's
    # priority. On a machine with other work (a CI machine running tests beside the bench) the
    # niced workers starve: each Ray Data execution starts new worker processes, and one
    # importing pandas at nice 15 behind four busy processes took minutes. Same priority for
    # every feed: a fair comparison, and a bench that finishes.
    os.environ.setdefault("RAY_worker_niceness", str(os.getpriority(os.PRIO_PROCESS, 0)))
    ray.init(
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        object_store_memory=RAY_OBJECT_STORE_BYTES,
        configure_logging=False,
    )
    ctx = ray.data.DataContext.get_current()  # imports ray.data, which configures its logging
    for name in ("ray", "ray.data"):  # then: Ray Data logs every execution at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def ray_for_report(config: dict, wanted: bool):
    """:func:`ray_session` if ``wanted``, else nothing; a bench report's ``config`` says which
    (``ray``) and, with Ray, the niceness a Ray task read (``ray_worker_niceness``)."""
    config["ray"] = wanted
    if not wanted:
        yield
        return
    with ray_session():
        config["ray_worker_niceness"] = worker_niceness()
        yield


def worker_niceness() -> int:
    """The niceness Ray's worker processes run at, as a task reads it in its own process."""
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)

    return ray.get(niceness.remote())


def ray_dataset(files: list[str]):
    """The snapshot's files as a Ray dataset, in a new file order each pass."""
    import ray

    return ray.data.read_parquet(list(files), shuffle="files")


def ray_to_tf(files: list[str], batch: int, rows: int, label: str) -> float:
    """Rows/s of Ray's ``to_tf`` (features: every other column) drained in a ``tf.function``."""
    ds = ray_dataset(files)
    features = [c for c in ds.columns() if c != label]
    with counting_descendants():
        tf_ds = ds.to_tf(
            feature_columns=features,
            label_columns=label,
            batch_size=batch,
            local_shuffle_buffer_size=RAY_SHUFFLE_ROWS,
        )
        return consume(tf_ds.repeat(), max(1, rows // batch)) * batch


def ray_iter(files: list[str], batch: int) -> float:
    """Rows/s of Ray's ``iter_tf_batches`` iterated in Python, a pass per epoch."""
    ds = ray_dataset(files)

    def epochs():
        while True:
            yield from ds.iter_tf_batches(
                batch_size=batch, local_shuffle_buffer_size=RAY_SHUFFLE_ROWS
            )

    it = epochs()
    with counting_descendants():
        return timed_loop(lambda: int(next(iter(next(it).values())).shape[0]))


def hand_written(files: list[str], batch: int, rows: int, dense) -> float:
    """Rows/s of pyarrow ``iter_batches`` into ``from_generator``, drained in a ``tf.function``.

    Args:
        dense: Turns one Arrow column into a dense numpy array (lists into ``(n, k)``).
    """
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def batches():
        for rb in record_batches(files, batch, rng):
            yield {name: dense(rb.column(i)) for i, name in enumerate(rb.schema.names)}

    first = next(batches())
    spec = {k: tf.TensorSpec((None, *v.shape[1:]), tf.as_dtype(v.dtype)) for k, v in first.items()}
    ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
    return consume(ds.repeat().prefetch(tf.data.AUTOTUNE), max(1, rows // batch)) * batch


def record_batches(files: list[str], batch: int, rng: np.random.Generator):
    """One pass of the hand-written loop's reads: pyarrow ``iter_batches`` of ``batch`` rows
    over ``files`` in an order drawn from ``rng`` (a new one each pass)."""
    import pyarrow.parquet as pq

    for path in rng.permutation(files):
        yield from pq.ParquetFile(path).iter_batches(batch_size=batch)


def in_memory_permuted(arrays: dict, batch: int) -> float:
    """Rows/s of in-memory tensors served in a new random order each epoch.

    Each epoch draws a permutation of every row; blocks of it (about ``GATHER_BYTES``, as
    keras_dl's cache gathers) are gathered from the in-memory columns in parallel and cut into
    batches. The rows that do not fill a whole block are left out, which only flatters this
    baseline.
    """
    import tensorflow as tf

    from keras_dl.data.hooks import rows_per_gather

    rows = len(next(iter(arrays.values())))
    per_block = min(rows_per_gather(arrays, batch), rows // batch * batch)
    blocks = rows // per_block
    columns = {k: tf.constant(a) for k, a in arrays.items()}

    def epoch(_):
        order = tf.random.shuffle(tf.range(rows, dtype=tf.int64))[: blocks * per_block]
        return tf.data.Dataset.from_tensor_slices(tf.reshape(order, (blocks, per_block)))

    def gather(index):
        return {
            k: tf.reshape(tf.gather(c, index), (per_block // batch, batch, *c.shape[1:]))
            for k, c in columns.items()
        }

    ds = tf.data.Dataset.range(1 << 40).flat_map(epoch)
    ds = ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    steps = blocks * per_block // batch
    return consume(ds.prefetch(tf.data.AUTOTUNE), steps) * batch
