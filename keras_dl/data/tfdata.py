"""Row-group batches to a ``tf.data.Dataset`` that ``model.fit`` consumes.

The generator yields blocks of whole batches, ``(k, batch, ...)`` per column, cut from the
row groups (already dense) with numpy views; ``from_tensor_slices`` hands them out a batch at
a time without copying (``rebatch`` copied every slice). The recipe's vectorized preprocessing
runs in parallel in tf.data, or once per row in the generator when the hook is deterministic
and its output fits ``data.cache`` (then later epochs replay its output). Training data
repeats forever, the next epoch's reader opening as one ends, and ``fit`` runs a fixed
``steps_per_epoch`` computed from row counts, so every rank runs the same number of steps."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from keras_dl.data import reader_lifecycle
from keras_dl.data.cache_memory import EpochCache
from keras_dl.data.features import BINARY, NUMERIC, ColumnPlan, FeatureSpec
from keras_dl.data.reader import iter_epoch_arrays, num_rows, shuffle_rows
from keras_dl.data.rows import TableStats, scan_table
from keras_dl.data.snapshot import TableSnapshot
from keras_dl.errors import DataError

PREPROCESS_ROWS = 128


@dataclass(frozen=True)
class ReadOptions:
    """How one split is read.

    Args:
        batch_size: Rows per batch yielded by the dataset (per replica / per rank).
        training: Repeat forever, shuffle and drop the last partial batch. Defaults to False.
        shard: This reader's shard (the rank). Defaults to 0.
        num_shards: Number of shards (the world size). Defaults to 1.
        shuffle: Shuffle row groups and rows, when training. Defaults to True.
        shuffle_buffer: Rows mixed in memory. Defaults to 4096.
        seed: Shuffle seed. Defaults to 42.
        workers: Petastorm reader threads. Defaults to 2.
        cache_max_bytes: Keep the split's decoded rows in memory after the first epoch when
            they fit in this many bytes (:mod:`keras_dl.data.cache_memory`). Defaults to 0
            (every epoch is read from the table).
    """

    batch_size: int
    training: bool = False
    shard: int = 0
    num_shards: int = 1
    shuffle: bool = True
    shuffle_buffer: int = 4096
    seed: int = 42
    workers: int = 2
    cache_max_bytes: int = 0


@dataclass
class DataPosition:
    """Where the next read of a training split starts: an epoch and a step within it."""

    epoch: int = 0
    step: int = 0


@dataclass
class SplitData:
    """A dataset plus what ``fit`` must know about it."""

    dataset: object
    steps: int
    stats: TableStats
    snapshot: TableSnapshot
    errors: list = field(default_factory=list)
    image_columns: tuple[str, ...] = ()
    position: DataPosition = field(default_factory=DataPosition)

    def start_at(self, global_step: int) -> None:
        """Start the next read of the dataset after ``global_step`` training steps.

        The epoch's rows are read again (same seed, same order) and the batches those steps
        consumed are dropped before they reach tf.data, so a resumed run continues exactly
        where it stopped. Call it before the dataset is iterated (before ``fit``).
        """
        self.position.epoch, self.position.step = divmod(int(global_step), max(self.steps, 1))

    def raise_error(self) -> None:
        """Re-raise the first error the reader hit inside tf.data, without TF's wrapping.

        Called from an ``except`` block: when the exception being handled is an image decoding
        failure, the table is re-scanned and the error names the file, row group and row.
        """
        if self.errors:
            raise self.errors[0]
        exc = sys.exc_info()[1]
        if exc is None or not self.image_columns or not _is_image_error(exc):
            return
        from keras_dl.data.images import BAD_IMAGE_MARKER, bad_image_error, locate_bad_images

        for column in self.image_columns:
            marked = f"{BAD_IMAGE_MARKER} column=" in str(exc)
            if marked and f"column={column}:" not in str(exc):
                continue
            if locate_bad_images(self.snapshot, column, limit=1):
                raise bad_image_error(self.snapshot, column, exc) from None


def make_dataset(
    snapshot: TableSnapshot,
    plan: ColumnPlan,
    options: ReadOptions,
    preprocess: Callable | None = None,
) -> SplitData:
    """Build the ``tf.data`` pipeline for one split of a table.

    Every epoch reads this shard's rows exactly once, as one Petastorm read (its row-group
    order seeded by ``seed + epoch``). For training, each epoch then yields exactly
    ``steps * batch_size`` rows: ``steps`` is the same on every shard (the smallest shard's
    full batches), and the few rows past it are left out of that epoch -- different rows each
    epoch when shuffling. Evaluation yields every row once, the last batch partial.

    Args:
        snapshot: The table (already filtered to the split).
        plan: Feature and label columns.
        options: Batch size, sharding and shuffling.
        preprocess: Optional ``fn(features, label) -> (features, label)`` run on whole batches
            inside tf.data (vectorized, parallel). Defaults to None.

    Returns:
        The dataset, its steps per epoch (equal on every shard) and the table's stats.

    Raises:
        DataError: When the split is empty, a shard has less than one batch for training, or
            there are fewer row groups than shards.
    """
    import tensorflow as tf

    stats = scan_table(snapshot, plan.columns)
    steps = _steps(snapshot, stats, options)
    errors: list = []
    position = DataPosition()
    shuffle = options.training and options.shuffle
    # Rows per call of the preprocess hook: whole batches, at least PREPROCESS_ROWS.
    preprocess_rows = options.batch_size * max(1, math.ceil(PREPROCESS_ROWS / options.batch_size))
    # Outlives each generator run (a re-made iterator, a resumed fit): it is the split's cache.
    cache = EpochCache(options.cache_max_bytes, shuffle, options.seed + options.shard)
    raw_signature = _structure({s.name: _tensor_spec(s) for s in _all_specs(plan)}, plan)
    # A deterministic hook on a split whose output fits the cache runs once per row: the cache
    # keeps its output (decoded images, not their bytes) and later epochs skip it.
    cached_hook = _cacheable_hook(preprocess, raw_signature, stats, options)

    def read(epoch: int):
        chunks = iter_epoch_arrays(
            snapshot,
            plan,
            stats,
            shard=options.shard,
            num_shards=options.num_shards,
            shuffle=shuffle,
            seed=options.seed + epoch if shuffle else None,
            workers=options.workers,
        )
        if cached_hook is None:
            return chunks
        return cached_hook.apply(chunks, plan, preprocess_rows)

    if cached_hook is None:

        def structure(values: dict):
            return _structure(values, plan)

        signature = _structure(
            {s.name: _tensor_spec(s, blocked=True) for s in _all_specs(plan)}, plan
        )
        in_graph = preprocess
    else:
        structure, signature, in_graph = cached_hook.pack, cached_hook.blocked_spec, None

    # Training streams epoch after epoch: the next epoch's reader opens as this one's ends
    # (about 45 ms on the wide table), while tf.data still holds the epoch's last batches.
    reads = _ReadAhead(read, ahead=lambda: options.training and cache.disabled)

    def generate():
        try:
            yield from _generate()
        except DataError as exc:  # surfaced by SplitData.raise_error, not as a TF op error
            errors.append(exc)
            raise
        finally:
            reads.close()

    def _generate():
        batch = options.batch_size
        block = preprocess_rows if in_graph is not None else batch
        epoch, skip = position.epoch, position.step * batch
        limit = steps * batch if options.training else None
        while True:
            if cache.ready(epoch, read):  # from memory: gathered a few blocks at a time
                buffer = options.shuffle_buffer if shuffle else 0
                index = cache.order(epoch, buffer, [options.seed, options.shard, epoch])
                index = index[skip : len(index) if limit is None else min(limit, len(index))]
                pieces = _gather(cache.columns, index, _rows_per_gather(cache, block))
            else:
                pieces = _trim(_stream(epoch), skip, limit)
            carry: dict | None = None  # the rows of a batch that began in the previous piece
            for arrays in pieces:
                blocks, carry = _blocks(arrays, carry, block)
                if blocks is not None:
                    yield structure(blocks)
            if carry is not None:  # evaluation's last, partial batch; a last preprocess chunk
                yield structure(_as_block(carry))
            if not options.training:
                return
            epoch, skip = epoch + 1, 0

    def _stream(epoch: int):
        chunks = cache.epoch(epoch, reads)
        if shuffle and options.shuffle_buffer > 0:
            chunks = shuffle_rows(
                chunks, options.shuffle_buffer, [options.seed, options.shard, epoch]
            )
        return chunks

    # The generator yields blocks of whole batches, (k, rows, ...) per column, and each block
    # is handed out one batch at a time by ``from_tensor_slices``, whose slices alias the block
    # (no copy). ``rebatch`` and ``unbatch`` copy every slice: on the wide table at batch 32
    # (200 columns) they ran at 0.5-0.6x of this.
    # lifecycle: the generator ends at its next step when the interpreter exits.
    generate = reader_lifecycle.guard_generator(generate)
    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    # Let the (Python) generator run ahead of slicing and preprocessing, on its own thread.
    ds = ds.prefetch(2)
    ds = ds.flat_map(_slices)
    if in_graph is not None:
        # A vectorized hook costs per call more than per row (image decoding runs a map_fn per
        # call): run it on chunks of at least PREPROCESS_ROWS rows, then cut the batches (a
        # hook may drop rows, e.g. undecodable images: rebatch, not a fixed split).
        ds = ds.map(in_graph, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.rebatch(options.batch_size, drop_remainder=options.training)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    opts = tf.data.Options()
    # Sharding is done by row group in the reader: tf.distribute must not shard again.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(opts)
    return SplitData(
        dataset=ds,
        steps=steps,
        stats=stats,
        snapshot=snapshot,
        errors=errors,
        image_columns=tuple(f.name for f in plan.features if f.kind == BINARY),
        position=position,
    )


def _steps(snapshot: TableSnapshot, stats: TableStats, options: ReadOptions) -> int:
    """Steps per epoch: every row once for evaluation; equal full batches on every shard."""
    where = f"Table {snapshot.uri!r} (version {snapshot.version})"
    if stats.rows == 0:
        raise DataError(
            f"{where} has no rows"
            f"{' matching ' + str(list(snapshot.row_filters)) if snapshot.row_filters else ''}. "
            "Write data to it, or check data.split_column, data.filters and the split names."
        )
    shards = options.num_shards
    stats.check_shards(shards, snapshot.uri)
    if not options.training:
        return math.ceil(stats.shard_rows(options.shard, shards) / options.batch_size)
    per_shard = [stats.shard_rows(s, shards) for s in range(shards)]
    smallest = min(range(shards), key=per_shard.__getitem__)
    steps = per_shard[smallest] // options.batch_size
    if steps == 0:
        raise DataError(
            f"{where}: shard {smallest} of {shards} has {per_shard[smallest]} row(s) after "
            f"deletions and filters, fewer than one batch of {options.batch_size}; every "
            "shard must run the same steps. Lower train.batch_size, use fewer processes, "
            "or rewrite the table with rows spread over more row groups."
        )
    return steps


class _ReadAhead:
    """``read(epoch)``, where the end of one epoch's read starts opening the next epoch's.

    When ``ahead()`` says the next epoch will be streamed too, a thread opens its reader and
    pulls its first chunk as soon as this epoch's reader is exhausted, so the reader's start-up
    overlaps the batches still in the pipeline. The reads are the same, in the same order.
    """

    def __init__(self, read: Callable, ahead: Callable[[], bool]):
        import threading

        self.read = read
        self.ahead = ahead
        self.lock = threading.Lock()
        self.pending = None  # (epoch, thread, result dict)

    def __call__(self, epoch: int):
        with self.lock:
            pending, self.pending = self.pending, None
        if pending is not None and pending[0] == epoch:
            _, thread, box = pending
            thread.join()
            if "error" in box:
                raise box["error"]
            it = box["it"]
            if "first" in box:
                yield box["first"]
        else:
            _close(pending)
            it = self.read(epoch)
        yield from it
        if self.ahead():
            self._open(epoch + 1)

    def _open(self, epoch: int) -> None:
        import threading

        box: dict = {}

        def start():
            box["it"] = it = self.read(epoch)
            try:
                box["first"] = next(it)
            except StopIteration:
                pass
            except BaseException as exc:  # re-raised by the read that takes it
                box["error"] = exc

        start = reader_lifecycle.run_tracked(start)  # lifecycle: the exit hook waits for it
        thread = threading.Thread(target=start, name=f"keras_dl-read-epoch-{epoch}", daemon=True)
        thread.start()
        with self.lock:
            old, self.pending = self.pending, (epoch, thread, box)
        _close(old)

    def close(self) -> None:
        """Stop a reader opened ahead and not taken (training stopped, or moved elsewhere)."""
        with self.lock:
            pending, self.pending = self.pending, None
        _close(pending)


def _close(pending) -> None:
    if pending is None:
        return
    _, thread, box = pending
    thread.join()
    it = box.get("it")
    if it is not None and hasattr(it, "close"):
        it.close()  # the reader's finally: stop and join its threads


GATHER_BYTES = 8 << 20  # a cached epoch is gathered about this much at a time


def _trim(chunks, skip: int, limit: int | None):
    """The rows ``skip`` to ``limit`` of an epoch's chunks (a resumed epoch; whole batches)."""
    at = 0  # rows of this epoch seen so far
    for arrays in chunks:
        n = num_rows(arrays)
        lo, hi = max(skip - at, 0), n if limit is None else min(limit - at, n)
        at += n
        if hi > lo:
            yield _slice(arrays, lo, hi, n)


def _gather(columns: dict, index: np.ndarray, rows: int):
    """``columns`` at ``index``, ``rows`` rows at a time (one copy, never the whole epoch).

    Numeric columns are gathered into 64-byte aligned arrays, which TensorFlow can take as
    tensors without a copy (measured: 5-10% less CPU per row replaying the wide table and the
    decoded images). ``mode="clip"``: with ``out``, the default mode buffers the result.
    """
    for lo in range(0, len(index), rows):
        part = index[lo : lo + rows]
        out = {}
        for k, v in columns.items():
            if v.dtype == object:
                out[k] = np.take(v, part, axis=0)
            else:
                out[k] = np.take(
                    v, part, axis=0, out=_aligned((len(part), *v.shape[1:]), v.dtype), mode="clip"
                )
        yield out


def _aligned(shape: tuple, dtype: np.dtype, align: int = 64) -> np.ndarray:
    """An uninitialized array whose data starts on an ``align``-byte boundary."""
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(size + align, dtype=np.uint8)
    start = -buffer.ctypes.data % align
    return buffer[start : start + size].view(dtype).reshape(shape)


def _rows_per_gather(cache: EpochCache, block: int) -> int:
    rows = max(len(cache.bounds) and int(cache.bounds[-1]), 1)
    per_row = max(cache.nbytes / rows, 1.0)
    return block * max(1, int(GATHER_BYTES / per_row) // block)


class _CachedHook:
    """A deterministic preprocess hook run in the generator, so the cache keeps its output.

    ``apply`` runs the hook (traced once) on each chunk, ``preprocess_rows`` rows per call, and
    returns ``{position: array}`` of its flattened outputs; ``pack`` rebuilds the hook's output
    structure from such a dict.
    """

    def __init__(self, concrete, out_spec):
        import tensorflow as tf

        self.concrete = concrete
        self.out_spec = out_spec
        flat = tf.nest.flatten(out_spec)
        self.keys = [str(i) for i in range(len(flat))]
        self.blocked_spec = tf.nest.pack_sequence_as(
            out_spec, [tf.TensorSpec((None, *s.shape), s.dtype) for s in flat]
        )

    def apply(self, chunks, plan: ColumnPlan, rows: int):
        import tensorflow as tf

        for arrays in chunks:
            n = num_rows(arrays)
            parts = []
            for lo in range(0, n, rows):
                args = _structure(_slice(arrays, lo, min(lo + rows, n), n), plan)
                out = self.concrete(*args) if isinstance(args, tuple) else self.concrete(args)
                parts.append([t.numpy() for t in tf.nest.flatten(out)])
            if parts:
                yield {
                    k: parts[0][i] if len(parts) == 1 else np.concatenate([p[i] for p in parts])
                    for i, k in enumerate(self.keys)
                }

    def pack(self, values: dict):
        import tensorflow as tf

        return tf.nest.pack_sequence_as(self.out_spec, [values[k] for k in self.keys])


def _cacheable_hook(preprocess, signature, stats: TableStats, options: ReadOptions):
    """A :class:`_CachedHook` when ``preprocess`` says it is deterministic (its attribute
    ``deterministic``), its outputs have fixed shapes per row, and this shard's outputs fit
    ``cache_max_bytes``; otherwise None (the hook runs in tf.data, every epoch)."""
    if preprocess is None or options.cache_max_bytes <= 0:
        return None
    if not getattr(preprocess, "deterministic", False):
        return None
    import tensorflow as tf

    fn = tf.function(lambda *args: preprocess(*args))
    args = signature if isinstance(signature, tuple) else (signature,)
    concrete = fn.get_concrete_function(*args)
    outputs = tf.nest.flatten(concrete.structured_outputs)
    per_row = 0
    for t in outputs:
        if t.dtype == tf.string or not t.shape[1:].is_fully_defined():
            return None
        per_row += int(np.prod(t.shape[1:], dtype=np.int64)) * t.dtype.size
    rows = stats.shard_rows(options.shard, options.num_shards)
    if rows * per_row > options.cache_max_bytes:
        return None
    out_spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec((None, *t.shape[1:]), t.dtype), concrete.structured_outputs
    )
    return _CachedHook(concrete, out_spec)


def _slice(arrays: dict, lo: int, hi: int, n: int) -> dict:
    if lo == 0 and hi == n:
        return arrays
    return {k: v[lo:hi] for k, v in arrays.items()}


def _blocks(arrays: dict, carry: dict | None, rows: int) -> tuple[dict | None, dict | None]:
    """``arrays`` (after ``carry``) as whole ``rows``-row blocks, ``(k, rows, ...)`` per column,
    and the rows left over for the next chunk (None when none are).

    Only a batch that straddles two chunks is copied; the rest are views.
    """
    n = num_rows(arrays)
    head = 0
    lead = None
    if carry is not None:
        need = rows - num_rows(carry)
        if n < need:
            return None, {k: np.concatenate([carry[k], v]) for k, v in arrays.items()}
        lead = {k: np.concatenate([carry[k], v[:need]]) for k, v in arrays.items()}
        head = need
    whole = (n - head) // rows
    end = head + whole * rows
    rest = {k: v[end:] for k, v in arrays.items()} if end < n else None
    if lead is None and whole == 0:
        return None, rest
    if lead is None:
        body = {k: v[head:end] for k, v in arrays.items()}
    elif whole == 0:
        body = lead
    else:
        # One copy of the chunk beats a second generator element (a conversion per column).
        body = {k: np.concatenate([lead[k], v[head:end]]) for k, v in arrays.items()}
    k = (end - head) // rows + (lead is not None)
    return {c: v.reshape(k, rows, *v.shape[1:]) for c, v in body.items()}, rest


def _slices(*parts):
    """One block's batches (a tuple element arrives as separate arguments)."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(parts[0] if len(parts) == 1 else parts)


def _as_block(arrays: dict) -> dict:
    """A last, partial batch as a block of one: ``(1, rows, ...)`` per column."""
    return {k: v[None] for k, v in arrays.items()}


def _structure(values: dict, plan: ColumnPlan):
    """(features, label): one feature is a bare tensor, several are a dict keyed by column."""
    if len(plan.features) == 1:
        features = values[plan.features[0].name]
    else:
        features = {f.name: values[f.name] for f in plan.features}
    if plan.label is None:
        return features
    return features, values[plan.label.name]


def _tensor_spec(spec: FeatureSpec, blocked: bool = False):
    """A column's batches, ``(None, ...)``; ``blocked``: blocks of batches, ``(None, None, ...)``."""
    import tensorflow as tf

    dtype = tf.as_dtype(spec.dtype) if spec.kind == NUMERIC else tf.string
    return tf.TensorSpec(shape=(None, *([None] if blocked else []), *spec.shape), dtype=dtype)


def _is_image_error(exc: BaseException) -> bool:
    from keras_dl.data.images import BAD_IMAGE_MARKER

    text = str(exc)
    return BAD_IMAGE_MARKER in text or any(
        m in text for m in ("Unknown image file format", "Invalid JPEG", "Invalid PNG", "jpeg::")
    )


def _all_specs(plan: ColumnPlan) -> list[FeatureSpec]:
    return list(plan.features) + ([plan.label] if plan.label else [])
