"""One split of a table to a ``tf.data.Dataset`` that ``model.fit`` consumes.

:class:`EpochStream` owns one shard's epochs: which rows (the shard planner's pieces), read by
Petastorm or served from memory, mixed, weighted and padded, cut into blocks of whole batches.
:func:`make_dataset` assembles the dataset around it: ``from_generator`` hands out the blocks,
``from_tensor_slices`` cuts them into batches without copying, and a recipe's vectorized
preprocessing runs in parallel in tf.data (or once per row in the generator when it is
deterministic and its output fits ``data.cache``).

Every training epoch trains every live row of the split exactly once, across all shards, and
keeps its last partial batch (Keras' own default). With several shards, every shard runs the
same ``steps``: a shard with fewer rows pads its last batch with copies of its rows whose sample
weight is 0, so the padding moves no gradient and no weighted metric. Evaluation yields every
row once, the last batch partial.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from keras_dl.data import reader_lifecycle
from keras_dl.data.blocks import (
    as_block,
    cut_blocks,
    gather,
    num_rows,
    rows_per_gather,
    trim,
    weigh_and_pad,
)
from keras_dl.data.cache_memory import EpochCache
from keras_dl.data.features import BINARY, ColumnPlan
from keras_dl.data.hook_cache import cacheable_hook
from keras_dl.data.read_ahead import ReadAhead
from keras_dl.data.reader import (
    RowGroupCounts,
    epoch_pieces,
    iter_unischema_rows,
    read_pieces,
    shuffle_rows,
    to_arrays,
)
from keras_dl.data.rows import TableStats, count_rows
from keras_dl.data.signature import input_signature, to_structure
from keras_dl.data.snapshot import TableSnapshot
from keras_dl.errors import DataError

PREPROCESS_ROWS = 128


@dataclass(frozen=True)
class ReadOptions:
    """How one split is read.

    Args:
        batch_size: Rows per batch yielded by the dataset (per replica / per rank).
        training: Repeat forever and shuffle. Defaults to False.
        shard: This reader's shard (the rank). Defaults to 0.
        num_shards: Number of shards (the world size). Defaults to 1.
        shuffle: Shuffle the rows, when training. Defaults to True.
        shuffle_buffer: Rows mixed in memory. Defaults to 4096.
        seed: Shuffle seed. Defaults to 42.
        workers: Petastorm reader threads. Defaults to 2.
        cache_max_bytes: Keep the split's decoded rows in memory after its first read when
            they fit in this many bytes (:mod:`keras_dl.data.cache_memory`). Defaults to 0
            (every epoch is read from the table).
        pad: Training: yield sample weights and pad each epoch to whole batches with
            zero-weight rows, even with one shard (several shards always do). Defaults to False.
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
    pad: bool = False


@dataclass
class DataPosition:
    """Where the next read of a training split starts: an epoch and a step within it."""

    epoch: int = 0
    step: int = 0


@dataclass
class SplitData:
    """A dataset plus what ``fit`` must know about it.

    ``rows`` is this shard's live rows per epoch (all of them are trained on every epoch) and
    ``padded_rows`` the zero-weight rows added to reach ``steps`` whole batches.
    """

    dataset: object
    steps: int
    stats: TableStats
    snapshot: TableSnapshot
    errors: list = field(default_factory=list)
    image_columns: tuple[str, ...] = ()
    position: DataPosition = field(default_factory=DataPosition)
    rows: int = 0
    padded_rows: int = 0
    weighted: bool = False

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

    Args:
        snapshot: The table (already filtered to the split).
        plan: Feature and label columns.
        options: Batch size, sharding and shuffling.
        preprocess: Optional ``fn(features, label) -> (features, label)`` run on whole batches
            inside tf.data (vectorized, parallel). Defaults to None.

    Returns:
        The dataset, its steps per epoch (equal on every shard) and the table's stats.

    Raises:
        DataError: When the split is empty, or has fewer live rows than shards.
    """
    import tensorflow as tf

    stream = EpochStream(snapshot, plan, options, preprocess)
    # lifecycle: the generator ends at its next step when the interpreter exits.
    generate = reader_lifecycle.guard_generator(stream.generate)
    ds = tf.data.Dataset.from_generator(generate, output_signature=stream.signature)
    # Let the (Python) generator run ahead of slicing and preprocessing, on its own thread.
    # Each block's batches are handed out by ``from_tensor_slices``, whose slices alias the
    # block (no copy); ``rebatch`` and ``unbatch`` copy every slice.
    ds = ds.prefetch(2).flat_map(_slices)
    if stream.in_graph is not None:
        # A vectorized hook costs per call more than per row (image decoding runs a map_fn per
        # call): run it on chunks of at least PREPROCESS_ROWS rows, then cut the batches,
        # keeping each epoch's last partial batch its own.
        ds = ds.map(stream.in_graph, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.flat_map(_batches(options.batch_size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    opts = tf.data.Options()
    # Sharding is done by rows in the reader: tf.distribute must not shard again.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(opts)
    return SplitData(
        dataset=ds,
        steps=stream.steps,
        stats=stream.stats,
        snapshot=snapshot,
        errors=stream.errors,
        image_columns=tuple(f.name for f in plan.features if f.kind == BINARY),
        position=stream.position,
        rows=stream.rows,
        padded_rows=stream.total - stream.rows,
        weighted=stream.weighted,
    )


def steps_per_epoch(snapshot: TableSnapshot, stats: TableStats, options: ReadOptions) -> int:
    """Batches per epoch: the largest shard's rows in batches, so every shard runs as many."""
    where = f"Table {snapshot.uri!r} (version {snapshot.version})"
    if stats.rows == 0:
        raise DataError(
            f"{where} has no rows"
            f"{' matching ' + str(list(snapshot.row_filters)) if snapshot.row_filters else ''}. "
            "Write data to it, or check data.split_column, data.filters and the split names."
        )
    stats.check_shards(options.num_shards, snapshot.uri)
    largest = stats.shard_rows(0, options.num_shards)
    return math.ceil(largest / options.batch_size)


class EpochStream:
    """One shard's epochs of one split, as blocks of whole batches for ``from_generator``.

    Public methods: :meth:`pieces` (which row groups an epoch reads), :meth:`chunks` (an
    epoch's rows, mixed), :meth:`epoch` (weighted and padded, from a step on) and
    :meth:`generate` (the blocks, epoch after epoch when training).
    """

    def __init__(self, snapshot, plan: ColumnPlan, options: ReadOptions, preprocess=None):
        self.snapshot, self.plan, self.options = snapshot, plan, options
        self.stats = count_rows(snapshot, plan.columns)
        self.steps = steps_per_epoch(snapshot, self.stats, options)
        self.shuffle = options.training and options.shuffle
        self.weighted = (
            options.training and plan.label is not None and (options.num_shards > 1 or options.pad)
        )
        self.rows = self.stats.shard_rows(options.shard, options.num_shards)
        self.total = self.steps * options.batch_size if self.weighted else self.rows
        self.groups = RowGroupCounts(snapshot, self.stats, plan.columns)
        self.position = DataPosition()
        self.errors: list = []
        table = snapshot.format != "petastorm"  # a Unischema dataset is read row by row
        self.cache = EpochCache(options.cache_max_bytes if table else 0)
        # Rows per call of the preprocess hook: whole batches, at least PREPROCESS_ROWS.
        batch = options.batch_size
        self.hook_rows = batch * max(1, math.ceil(PREPROCESS_ROWS / batch))
        raw = input_signature(plan)
        self.hook = cacheable_hook(preprocess, raw, self.stats.rows, self.cache.max_bytes)
        if self.hook is None:
            self.pack = lambda values: to_structure(values, plan)
            self.signature = input_signature(plan, blocked=True, weighted=self.weighted)
            self.in_graph = _with_weights(preprocess) if self.weighted else preprocess
        else:
            self.pack, self.in_graph = self.hook.pack, None
            self.signature = self.hook.signature(self.weighted)
        self.block_rows = self.hook_rows if self.in_graph is not None else batch
        if table:
            # Open (and check) the footers of the files this shard reads first, so a missing
            # column or a null is refused now, by file, not inside tf.data.
            self.pieces(0)
        # Training streams epoch after epoch: the next epoch's reader opens as this one's ends.
        self.reads = ReadAhead(self._read, ahead=lambda: options.training and self.cache.disabled)

    def pieces(self, epoch: int):
        """The row groups (and masks) this shard reads in ``epoch``, in order."""
        o = self.options
        seed = o.seed + epoch if self.shuffle else None
        return epoch_pieces(
            self.snapshot, self.stats, o.shard, o.num_shards, self.shuffle, seed, self.groups
        )

    def chunks(self, epoch: int):
        """Epoch ``epoch``'s rows of this shard, mixed by the shuffle buffer, as chunks."""
        o = self.options
        buffer = o.shuffle_buffer if self.shuffle else 0
        mix_seed = [o.seed, o.shard, epoch]
        if self.cache.ready or self._fill_from_whole_split():
            index = self.cache.order(self.pieces(epoch), buffer, mix_seed)
            if len(index) != self.rows:
                raise DataError(
                    f"Table {self.snapshot.uri!r}: the cached epoch has {len(index)} rows where "
                    f"shard {o.shard} of {o.num_shards} holds {self.rows}. Report it."
                )
            columns = self.cache.columns
            return gather(columns, index, rows_per_gather(columns, self.block_rows))
        chunks = (arrays for _, arrays in self.reads(epoch))
        return shuffle_rows(chunks, buffer, mix_seed) if buffer > 0 else chunks

    def epoch(self, epoch: int, skip: int = 0):
        """An epoch's chunks with sample weights and padding (when weighted), after ``skip``."""
        chunks = self.chunks(epoch)
        if self.weighted:
            chunks = weigh_and_pad(chunks, self.rows, self.total)
        return trim(chunks, skip) if skip else chunks

    def generate(self):
        """The blocks of batches of every epoch from :attr:`position` (one epoch to evaluate)."""
        try:
            epoch, skip = self.position.epoch, self.position.step * self.options.batch_size
            while True:
                carry = None  # the rows of a batch that began in the previous chunk
                for arrays in self.epoch(epoch, skip):
                    blocks, carry = cut_blocks(arrays, carry, self.block_rows)
                    if blocks is not None:
                        yield self.pack(blocks)
                if carry is not None:  # the epoch's last, partial batch (or hook chunk)
                    yield self.pack(as_block(carry))
                if not self.options.training:
                    return
                epoch, skip = epoch + 1, 0
        except DataError as exc:  # surfaced by SplitData.raise_error, not as a TF op error
            self.errors.append(exc)
            raise
        finally:
            self.reads.close()

    def _read(self, epoch: int):
        """``(piece, arrays)`` of one epoch, streamed (and kept when it is the whole split)."""
        o = self.options
        if self.snapshot.format == "petastorm":
            seed = o.seed + epoch if self.shuffle else None
            args = (self.snapshot, self.plan, self.stats, o.shard, o.num_shards, self.shuffle)
            return ((None, a) for a in iter_unischema_rows(*args, seed, o.workers))
        pieces = self.pieces(epoch)
        chunks = self._arrays(pieces)
        if not self.cache.disabled and sum(p.rows for p in pieces) == self.stats.rows:
            chunks = self.cache.fill(chunks)  # kept only if every row group came whole
        return chunks

    def _arrays(self, pieces):
        read = read_pieces(self.snapshot, self.plan.columns, pieces, self.options.workers)
        chunks = ((p, to_arrays(t, self.plan, self.snapshot)) for p, t in read)
        return self.hook.apply(chunks, self.plan, self.hook_rows) if self.hook else chunks

    def _fill_from_whole_split(self) -> bool:
        """With several shards a rank reads only its rows: fill the cache with one read of the
        whole split instead, then serve every epoch from memory (if it fits)."""
        if self.cache.disabled or self.options.num_shards == 1:
            return False
        pieces = epoch_pieces(self.snapshot, self.stats, groups=self.groups)
        for _ in self.cache.fill(self._arrays(pieces), emit=False):
            pass
        return self.cache.ready


def _with_weights(preprocess: Callable | None):
    """``preprocess`` on ``(features, label, weight)``: the hook sees ``(features, label)``
    (or all three, if it says ``takes_weights``) and must keep every row."""
    if preprocess is None:
        return None
    if getattr(preprocess, "takes_weights", False):
        return preprocess

    def apply(features, label, weight):
        import tensorflow as tf

        features, label = preprocess(features, label)
        with tf.control_dependencies(
            [
                tf.debugging.assert_equal(
                    tf.shape(label)[0],
                    tf.shape(weight)[0],
                    message="The recipe's preprocess hook dropped or added rows; with several "
                    "ranks a hook must keep every row (or take and return sample weights: "
                    "set its attribute takes_weights).",
                )
            ]
        ):
            weight = tf.identity(weight)
        return features, label, weight

    return apply


def _slices(*parts):
    """One block's batches (a tuple element arrives as separate arguments)."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(parts[0] if len(parts) == 1 else parts)


def _batches(batch: int):
    """A hook's output chunk as batches of ``batch`` rows, the last one partial if it is."""
    import tensorflow as tf

    def split(*parts):
        element = parts[0] if len(parts) == 1 else parts
        n = tf.shape(tf.nest.flatten(element)[0])[0]
        k = n // batch

        def whole(t):
            return tf.reshape(t[: k * batch], tf.concat([[k, batch], tf.shape(t)[1:]], 0))

        full = tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(whole, element))
        rest = tf.nest.map_structure(lambda t: t[k * batch :], element)
        tail = tf.data.Dataset.from_tensors(rest).filter(
            lambda *r: tf.shape(tf.nest.flatten(r)[0])[0] > 0
        )
        return full.concatenate(tail)

    return split


def _is_image_error(exc: BaseException) -> bool:
    from keras_dl.data.images import BAD_IMAGE_MARKER

    text = str(exc)
    return BAD_IMAGE_MARKER in text or any(
        m in text for m in ("Unknown image file format", "Invalid JPEG", "Invalid PNG", "jpeg::")
    )


__all__ = ["DataPosition", "EpochStream", "ReadOptions", "SplitData", "make_dataset", "num_rows"]
