"""The paths ``keras-dl bench input`` compares, each timed the way ``fit`` consumes data.

Every tf.data path is drained by an iterator inside a ``tf.function`` (after a warm-up that
traces it and fills the pipeline), so eager Python iteration adds no per-batch cost of its own.
The reader-level paths (raw pyarrow, Petastorm's reader alone) are plain Python loops over whole
row groups, which is what they are.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

MIN_SECONDS = 3.0  # each tf.data figure is timed over at least this long


def measure_tabular(path: str, batches: list[int], label: str | None, rounds: int = 3) -> dict:
    """Raw pyarrow, reader alone, in-memory, stock Petastorm and keras_dl on one table."""
    from keras_dl.data import open_table

    snapshot = open_table(path)
    _, arrays = raw_pyarrow(snapshot)
    rows = len(next(iter(arrays.values())))
    row_bytes = sum(a.nbytes for a in arrays.values()) / rows
    out = {"rows": rows, "bytes_per_row": round(row_bytes, 1), "batches": {}}
    for b in batches:
        figures = best_of(
            rounds,
            {
                "raw_pyarrow": lambda: raw_pyarrow(snapshot)[0],
                "reader_alone": lambda: reader_alone(snapshot),
                "in_memory": lambda b=b: in_memory(arrays, b),
                "stock": lambda b=b: stock(snapshot, b, rows),
                "keras_dl": lambda b=b: consume_split(keras_dl_dataset(path, b, label), b),
            },
        )
        out["batches"][str(b)] = _with_ratios(figures, row_bytes, tabular=True)
    return out


def measure_images(url: str, delta: str, batches: list[int], rounds: int = 3) -> dict:
    """Petastorm's codec path, tf.data decoding bytes from memory, and keras_dl, on one set."""
    import pyarrow.parquet as pq

    from keras_dl.data import open_table

    snapshot = open_table(delta)
    table = pq.read_table(list(snapshot.files))  # the dataset reader on pyarrow 12 and 25 alike
    images = np.asarray(table.column("image").to_pylist(), dtype=object)
    labels = table.column("label").to_numpy()
    row_bytes = sum(len(b) for b in images) / len(images)
    out = {"rows": len(images), "bytes_per_row": round(row_bytes, 1), "batches": {}}
    for b in batches:
        figures = best_of(
            rounds,
            {
                "petastorm_codec": lambda b=b: petastorm_codec(url, b, len(images)),
                "in_memory_decode": lambda b=b: in_memory_decode(images, labels, b),
                "keras_dl": lambda b=b: consume_split(keras_dl_images(delta, b), b),
            },
        )
        out["batches"][str(b)] = _with_ratios(figures, row_bytes, tabular=False)
    return out


def profile_stages(path: str, batch: int) -> dict[str, float]:
    """Rows/s of keras_dl's pipeline cut after each stage, to show where the time goes.

    reader: Petastorm's batch reader alone; +convert: plus keras_dl's per-row-group casts;
    +shuffle: plus the in-memory row shuffle; +from_generator: plus handing the arrays to
    tf.data; +rebatch: plus cutting them into batches (the whole training pipeline but the
    final prefetch).
    """
    import tensorflow as tf

    from keras_dl.data import open_table, plan_columns
    from keras_dl.data.reader import iter_epoch_arrays, shuffle_rows
    from keras_dl.data.rows import scan_table
    from keras_dl.data.tfdata import _structure, _tensor_spec

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), None)
    stats = scan_table(snapshot, plan.columns)

    def groups():
        epoch = 0
        while True:  # epochs without end, each one exact, as training reads them
            yield from iter_epoch_arrays(snapshot, plan, stats, shuffle=True, seed=epoch)
            epoch += 1

    def python_rate(it, rows=0, start=None):
        next(it)
        start = time.perf_counter()
        while time.perf_counter() - start < MIN_SECONDS / 2:
            rows += len(next(iter(next(it).values())))
        return rows / (time.perf_counter() - start)

    out = {
        "reader": reader_alone(snapshot),
        "+convert": python_rate(groups()),
        "+shuffle": python_rate(shuffle_rows(groups(), 4096, 0)),
    }
    spec = _structure({f.name: _tensor_spec(f) for f in plan.features}, plan)

    def gen():
        for arrays in shuffle_rows(groups(), 4096, 0):
            yield _structure(arrays, plan)

    ds = tf.data.Dataset.from_generator(gen, output_signature=spec).prefetch(2)
    group_rows = int(np.mean([r.num_rows for r in _row_groups(snapshot)]))
    out["+from_generator"] = consume(ds, 50) * group_rows
    out["+rebatch"] = (
        consume(ds.rebatch(batch, drop_remainder=True), 4 * group_rows // batch) * batch
    )
    return {k: round(v) for k, v in out.items()}


def _row_groups(snapshot):
    import pyarrow.parquet as pq

    for path in snapshot.files:
        meta = pq.ParquetFile(path).metadata
        for i in range(meta.num_row_groups):
            yield meta.row_group(i)


def best_of(rounds: int, paths: dict) -> dict[str, float]:
    """The best rate of each path over ``rounds`` interleaved rounds.

    The machine is shared: interleaving exposes every path to the same background load, and
    the best round is the one least disturbed by it.
    """
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in paths.items():
            best[name] = max(best.get(name, 0.0), fn())
    return best


def raw_pyarrow(snapshot) -> tuple[float, dict[str, np.ndarray]]:
    """Read every row group with pyarrow and convert it to dense numpy, vectorized."""
    import pyarrow.parquet as pq

    start, parts = time.perf_counter(), []
    for path in snapshot.files:
        pf = pq.ParquetFile(path)
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg)
            parts.append({name: _dense(t.column(name)) for name in t.column_names})
    seconds = time.perf_counter() - start
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return len(next(iter(arrays.values()))) / seconds, arrays


def reader_alone(snapshot) -> float:
    """Petastorm's batch reader, iterated in Python, touching every column: rows/s."""
    from petastorm import make_batch_reader

    from keras_dl.storage import file_url

    urls = [file_url(f) for f in snapshot.files]
    while True:
        with _closing(make_batch_reader(urls, workers_count=2, num_epochs=1)) as reader:
            it = iter(reader)
            # The reader's start-up is not throughput. Petastorm 0.13.1 sometimes ends a
            # finite read before its first row group (see keras_dl.data.reader): re-open.
            if next(it, None) is None:
                continue
            start, rows = time.perf_counter(), 0
            for batch in it:
                rows += len(batch[0])
            return rows / (time.perf_counter() - start)


def in_memory(arrays: dict, batch: int) -> float:
    """``from_tensor_slices(arrays).batch(B)``: the tf.data ceiling at that batch size."""
    import tensorflow as tf

    rows = len(next(iter(arrays.values())))
    ds = tf.data.Dataset.from_tensor_slices(arrays).repeat().batch(batch).prefetch(-1)
    return consume(ds, rows // batch) * batch


def stock(snapshot, batch: int, rows: int) -> float:
    """Petastorm's own TF path: ``make_petastorm_dataset(reader).unbatch().batch(B)``."""
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset

    from keras_dl.storage import file_url

    urls = [file_url(f) for f in snapshot.files]
    with _closing(make_batch_reader(urls, workers_count=2, num_epochs=None)) as reader:
        ds = make_petastorm_dataset(reader).unbatch().batch(batch).prefetch(-1)
        return consume(ds, rows // batch) * batch


def petastorm_codec(url: str, batch: int, rows: int) -> float:
    """Petastorm's image path: ``make_reader`` decodes each JPEG with its codec, per row."""
    import tensorflow as tf
    from petastorm import make_reader
    from petastorm.tf_utils import make_petastorm_dataset

    with _closing(make_reader(url, workers_count=2, num_epochs=None)) as reader:
        ds = make_petastorm_dataset(reader).batch(batch)
        ds = ds.map(lambda r: (tf.cast(r.image, tf.float32) / 255.0, r.label)).prefetch(-1)
        return consume(ds, max(1, rows // batch)) * batch


def in_memory_decode(images: np.ndarray, labels: np.ndarray, batch: int) -> float:
    """tf.data decoding the same bytes from memory, per image, with AUTOTUNE parallelism."""
    import tensorflow as tf

    from keras_dl.bench.input_tables import IMAGE_SIZE

    def decode(encoded, label):
        # The images are stored at IMAGE_SIZE: decode and scale, as a user would write it.
        img = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        img = tf.ensure_shape(img, (IMAGE_SIZE, IMAGE_SIZE, 3))
        return tf.cast(img, tf.float32) / 255.0, label

    ds = tf.data.Dataset.from_tensor_slices((images.astype(bytes), labels)).repeat()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(-1)
    return consume(ds, max(1, len(images) // batch)) * batch


def keras_dl_dataset(path: str, batch: int, label: str | None):
    """keras_dl's training pipeline over a table (repeating, shuffled, as ``fit`` gets it)."""
    from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), label)
    return make_dataset(snapshot, plan, ReadOptions(batch_size=batch, training=True))


def keras_dl_images(path: str, batch: int):
    """keras_dl's training pipeline over the image table, decoding with ImagePreprocess."""
    from keras_dl.bench.input_tables import IMAGE_SIZE
    from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns
    from keras_dl.data.images import make_image_preprocess

    snapshot = open_table(path)
    plan = plan_columns(snapshot, ("image",), "label", accept=("binary",))
    hook = make_image_preprocess("image", (IMAGE_SIZE, IMAGE_SIZE))
    return make_dataset(snapshot, plan, ReadOptions(batch_size=batch, training=True), hook)


def consume_split(split, batch: int) -> float:
    """Rows/s of a keras_dl split over one epoch of steps."""
    return consume(split.dataset, split.steps) * batch


def consume(ds, steps: int, warmup: int | None = None) -> float:
    """Batches/s of ``ds`` drained by an iterator inside a ``tf.function``, as ``fit`` does."""
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
    drain(it, tf.constant(warmup or max(2, steps // 10)))  # trace, start readers, fill buffers
    # Whole epochs until MIN_SECONDS have passed, so prefetched batches are a small share.
    start, done = time.perf_counter(), 0
    while done == 0 or time.perf_counter() - start < MIN_SECONDS:
        drain(it, tf.constant(steps)).numpy()
        done += steps
    return done / (time.perf_counter() - start)


@contextlib.contextmanager
def _closing(reader):
    """Stop and join a Petastorm reader (its own ``__exit__`` prints to stdout)."""
    try:
        yield reader
    finally:
        reader.stop()
        reader.join()


def _dense(col) -> np.ndarray:
    import pyarrow as pa

    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        flat = col.flatten().to_numpy()
        return flat.reshape(len(col), -1)
    return col.to_numpy(zero_copy_only=False)


def _with_ratios(figures: dict[str, float], row_bytes: float, tabular: bool) -> dict:
    k = figures["keras_dl"]
    ratios = {}
    for name, value in figures.items():
        if name != "keras_dl":
            ratios[f"keras_dl/{name}"] = k / value
    if tabular:
        ratios["keras_dl/min(reader_alone,in_memory)"] = k / min(
            figures["reader_alone"], figures["in_memory"]
        )
    return {
        "rows_per_s": {n: round(v) for n, v in figures.items()},
        "mb_per_s": {n: round(v * row_bytes / 1e6, 1) for n, v in figures.items()},
        "ratios": {n: round(v, 3) for n, v in ratios.items()},
    }
