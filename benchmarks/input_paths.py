"""The paths ``keras-dl bench input`` compares, each timed the way ``fit`` consumes data.

Every tf.data path is drained by an iterator inside a ``tf.function`` (after a warm-up that
traces it and fills the pipeline), so eager Python iteration adds no per-batch cost of its own.
The reader-level paths (raw pyarrow, Petastorm's reader alone) are plain Python loops over whole
row groups, which is what they are. ``keras_dl`` streams every epoch from the table (what the
reader baselines are set against); ``keras_dl_cached`` is the same pipeline as a run gets it by
default, ``data.cache=auto``, timed on the epochs served from memory. Each call returns one rate timed over at least
:data:`benchmarks.timing.MIN_SECONDS`; :mod:`benchmarks.timing` repeats and summarizes.
"""

from __future__ import annotations

import contextlib

import numpy as np

from benchmarks.timing import consume, measure_rounds, summarize, timed_loop

TABULAR_PATHS = (
    "raw_pyarrow",
    "reader_alone",
    "in_memory",
    "in_memory_cache",
    "tfdata_floor",
    "stock_unbatch",
    "stock_rebatch",
    "in_memory_permuted",
    "hand_written",
    "keras_dl",
    "keras_dl_cached",
)
RAY_PATHS = ("ray_to_tf", "ray_iter")  # with Ray Data installed (the bench extra)
SUBJECTS = ("keras_dl", "keras_dl_cached")
PACKED_SUBJECTS = ("keras_dl_packed", "keras_dl_packed_cached")  # tables with columns to pack
CACHE_BYTES = 256 << 20  # data.cache_max_bytes' default: these tables fit


def measure_tabular(
    path: str, batches: list[int], label: str | None, rounds: int = 3, ray: bool = False
) -> dict:
    """Every tabular path on one table, at each batch size: medians, spreads, ratios.

    Args:
        ray: Also measure the Ray Data peers (inside :func:`input_peers.ray_session`).
    """
    from benchmarks import input_peers as peers
    from keras_dl.data import open_table
    from keras_dl.data.hooks import pack

    snapshot = open_table(path)
    files = list(snapshot.files)
    arrays = read_columns(snapshot)
    rows = len(next(iter(arrays.values())))
    row_bytes = sum(a.nbytes for a in arrays.values()) / rows
    ray_label = label or list(arrays)[-1]  # to_tf wants a label: any column, all are read
    plan = packed_plan(snapshot, label)
    packs = plan is not None
    packed_arrays = pack(arrays, plan) if packs else {}
    subjects = (*SUBJECTS, *PACKED_SUBJECTS) if packs else SUBJECTS
    out = {"rows": rows, "bytes_per_row": round(row_bytes, 1), "batches": {}}
    for b in batches:
        cpu: dict = {}
        ray_paths = {
            "ray_to_tf": lambda b=b: peers.ray_to_tf(files, b, rows, ray_label),
            "ray_iter": lambda b=b: peers.ray_iter(files, b),
        }
        # data.pack_features (the tabular recipe's default): the same pipeline, one (B, k)
        # tensor per dtype instead of k, where the table has columns to pack; its floor hands
        # over batches of that shape.
        packed = {
            "tfdata_floor_packed": lambda b=b: tfdata_floor(packed_arrays, b),
            "keras_dl_packed": lambda b=b: consume_split(
                keras_dl_dataset(path, b, label, pack=True), b
            ),
            "keras_dl_packed_cached": lambda b=b: consume_split(
                keras_dl_dataset(path, b, label, CACHE_BYTES, pack=True), b, cached=True
            ),
        }
        samples = measure_rounds(
            rounds,
            {
                "raw_pyarrow": lambda: raw_pyarrow(snapshot),
                "reader_alone": lambda: reader_alone(snapshot),
                "in_memory": lambda b=b: in_memory(arrays, b),
                "in_memory_cache": lambda b=b: in_memory(arrays, b, cache=True),
                "tfdata_floor": lambda b=b: tfdata_floor(arrays, b),
                "stock_unbatch": lambda b=b: stock(snapshot, b, rows, "unbatch"),
                "stock_rebatch": lambda b=b: stock(snapshot, b, rows, "rebatch"),
                "in_memory_permuted": lambda b=b: peers.in_memory_permuted(arrays, b),
                "hand_written": lambda b=b: peers.hand_written(files, b, rows, _dense),
                **(ray_paths if ray else {}),
                "keras_dl": lambda b=b: consume_split(keras_dl_dataset(path, b, label), b),
                "keras_dl_cached": lambda b=b: consume_split(
                    keras_dl_dataset(path, b, label, CACHE_BYTES), b, cached=True
                ),
                **(packed if packs else {}),
            },
            cpu,
        )
        # The ceiling streaming is held to: the slower of decoding (raw pyarrow) and handing
        # batches over (the tf.data floor), round by round.
        samples["limit"] = [
            min(a, f) for a, f in zip(samples["raw_pyarrow"], samples["tfdata_floor"])
        ]
        if packs:  # packed batches are cheaper to hand over: their own, higher, ceiling
            samples["limit_packed"] = [
                min(a, f) for a, f in zip(samples["raw_pyarrow"], samples["tfdata_floor_packed"])
            ]
        out["batches"][str(b)] = summarize(samples, subjects, scale=row_bytes, cpu=cpu)
        out["batches"][str(b)]["rows_trained_per_epoch_fraction"] = trained_fraction(
            keras_dl_dataset(path, b, label), rows
        )
    return out


def packed_plan(snapshot, label: str | None):
    """The table's column plan under ``data.pack_features``, or None if it packs nothing."""
    from keras_dl.data import plan_columns
    from keras_dl.data.hooks import is_packed

    plan = plan_columns(snapshot, (), label, pack=True)
    return plan if is_packed(plan) else None


def trained_fraction(split, table_rows: int) -> float:
    """Rows one training epoch yields (counted, batch by batch), as a fraction of the table:
    1.0 when every row trains once per epoch."""
    seen = 0
    for element in split.dataset.take(split.steps):
        first = element[0] if isinstance(element, tuple) else element
        first = next(iter(first.values())) if isinstance(first, dict) else first
        seen += int(first.shape[0])
    return round(seen / table_rows, 6)


def read_columns(snapshot) -> dict[str, np.ndarray]:
    """The whole table as dense numpy columns (the in-memory baselines' data)."""
    parts = list(_read_groups(snapshot))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def raw_pyarrow(snapshot) -> float:
    """Rows/s of pyarrow reading every row group and converting it to dense numpy, vectorized."""

    def one_pass():
        return sum(len(next(iter(p.values()))) for p in _read_groups(snapshot))

    return timed_loop(one_pass)


def reader_alone(snapshot) -> float:
    """Rows/s of Petastorm's batch reader iterated in Python, touching every column."""
    from petastorm import make_batch_reader

    from keras_dl.storage import file_url

    urls = [file_url(f) for f in snapshot.files]
    # Infinite epochs: Petastorm 0.13.1 sometimes ends a finite read early (keras_dl.data.stream.shard_epochs).
    with _closing(make_batch_reader(urls, workers_count=2, num_epochs=None)) as reader:
        it = iter(reader)
        return timed_loop(lambda: len(next(it)[0]))


def in_memory(arrays: dict, batch: int, cache: bool = False) -> float:
    """Rows/s of in-memory tensors sliced a whole batch at a time (vectorized), optionally cached.

    The result is what ``from_tensor_slices(columns).batch(B)`` yields, without its per-row
    slicing: the columns are reshaped to ``(steps, B, ...)`` and sliced once per batch, which is
    the ceiling a pipeline of dense batches can reach in tf.data. With ``cache``, the batches are
    served by ``.cache()`` (filled during the untimed warm-up epoch), the cost of a cached epoch.
    """
    import tensorflow as tf

    rows = len(next(iter(arrays.values())))
    steps = rows // batch
    shaped = {k: a[: steps * batch].reshape(steps, batch, *a.shape[1:]) for k, a in arrays.items()}
    ds = tf.data.Dataset.from_tensor_slices(shaped)
    if cache:
        ds = ds.cache()
    ds = ds.repeat().prefetch(tf.data.AUTOTUNE)
    return consume(ds, steps, warmup=steps if cache else None) * batch


def tfdata_floor(arrays: dict, batch: int) -> float:
    """Rows/s of one batch repeated (``from_tensors(batch).repeat()``): no data work at all.

    What handing a batch of these columns to the consuming ``tf.function`` costs by itself, so
    no tf.data path can beat it at this batch size here: at small batches it, not the reader,
    can be the ceiling.
    """
    import tensorflow as tf

    one = {k: a[:batch] for k, a in arrays.items()}
    rows = len(next(iter(arrays.values())))
    ds = tf.data.Dataset.from_tensors(one).repeat()
    return consume(ds, max(1, rows // batch)) * batch


def stock(snapshot, batch: int, rows: int, how: str) -> float:
    """Rows/s of Petastorm's own TF path, ``make_petastorm_dataset(reader)``, cut to batches.

    Args:
        how: "unbatch" (``.unbatch().batch(B)``, per row, as Petastorm documents) or
            "rebatch" (``.rebatch(B)``, whole row groups cut into batches).
    """
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset

    from keras_dl.storage import file_url

    urls = [file_url(f) for f in snapshot.files]
    with _closing(make_batch_reader(urls, workers_count=2, num_epochs=None)) as reader:
        ds = make_petastorm_dataset(reader)
        ds = ds.unbatch().batch(batch) if how == "unbatch" else ds.rebatch(batch)
        return consume(ds.prefetch(-1), rows // batch) * batch


def keras_dl_dataset(
    path: str,
    batch: int,
    label: str | None,
    cache_max_bytes: int = 0,
    pack: bool = False,
    stream=None,
):
    """keras_dl's training pipeline over a table (repeating, shuffled, as ``fit`` gets it).

    Streaming by default (every epoch read from the table, what the reader baselines are set
    against); ``cache_max_bytes`` turns ``data.cache`` on; ``pack``: ``data.pack_features``;
    ``stream``: ``make_dataset``'s (how the split's stream is made; None: keras_dl's own).
    """
    from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), label, pack=pack)
    options = ReadOptions(batch_size=batch, training=True, cache_max_bytes=cache_max_bytes)
    return make_dataset(snapshot, plan, options, stream=stream)


def keras_dl_images(path: str, batch: int, cache_max_bytes: int = 0):
    """keras_dl's training pipeline over the image table, decoding with ImagePreprocess."""
    from benchmarks.input_tables import IMAGE_SIZE
    from keras_dl.data import (
        ReadOptions,
        make_dataset,
        make_image_preprocess,
        open_table,
        plan_columns,
    )

    snapshot = open_table(path)
    plan = plan_columns(snapshot, ("image",), "label", accept=("binary",))
    hook = make_image_preprocess("image", (IMAGE_SIZE, IMAGE_SIZE))
    options = ReadOptions(batch_size=batch, training=True, cache_max_bytes=cache_max_bytes)
    return make_dataset(snapshot, plan, options, hook)


def consume_split(split, batch: int, cached: bool = False) -> float:
    """Rows/s of a keras_dl split, in calls of one epoch of steps.

    With ``cached``, the untimed warm-up is a whole epoch plus one batch (it fills
    ``data.cache``), so the timed epochs are the ones served from memory.
    """
    rate = consume(split.dataset, split.steps, warmup=split.steps + 1 if cached else None)
    return rate * split.rows / split.steps  # rows per step: the last batch may be partial


@contextlib.contextmanager
def _closing(reader):
    """Stop and join a Petastorm reader (its own ``__exit__`` prints to stdout)."""
    try:
        yield reader
    finally:
        reader.stop()
        reader.join()


def _read_groups(snapshot):
    """Each row group of the table read by pyarrow, as dense numpy columns."""
    import pyarrow.parquet as pq

    for path in snapshot.files:
        pf = pq.ParquetFile(path)
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg)
            yield {name: _dense(t.column(name)) for name in t.column_names}


def _dense(col) -> np.ndarray:
    import pyarrow as pa

    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        flat = col.flatten().to_numpy()
        return flat.reshape(len(col), -1)
    return col.to_numpy(zero_copy_only=False)
