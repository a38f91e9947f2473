"""One split of a table as the ``tf.data.Dataset`` that ``model.fit`` consumes.

:func:`make_dataset` makes the split's :class:`~keras_dl.data.stream.epoch_stream.EpochStream` (which
rows, read how, cut into blocks of whole batches) and :func:`stream_dataset` wraps it:
``from_generator`` hands out the blocks, ``from_tensor_slices`` cuts them into batches without
copying, and a recipe's vectorized preprocessing runs in parallel in tf.data (or once per row in
the generator when it is deterministic and its output fits ``data.cache``).

tf.data raises an error of the generator as a ``tf.errors.UnknownError`` holding only its text.
:func:`original_errors` (``with data.original_errors(): model.fit(...)``), keras_dl's own
training and :meth:`SplitData.batches` raise the original instead: the reader's
:class:`~keras_dl.errors.DataError` naming the table, file and row group, or for an undecodable
image, one naming its file, row group and row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from keras_dl.data.stream import shutdown
from keras_dl.data.stream.epoch_position import EpochPosition, Resume
from keras_dl.data.stream.epoch_stream import EpochStream
from keras_dl.data.stream.features import BINARY, ColumnPlan
from keras_dl.data.stream.mix_stream import MixStream
from keras_dl.data.stream.read_options import ReadOptions
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.tables.stats import TableStats
from keras_dl.errors import KerasDLError


@dataclass
class SplitData:
    """A dataset plus what ``fit`` must know about it.

    ``rows`` is this shard's live rows per epoch (all of them are trained on every epoch) and
    ``padded_rows`` the zero-weight rows added to reach ``steps`` whole batches. ``errors`` are
    the last exceptions its generator raised inside tf.data (see :meth:`original_error`).
    """

    dataset: object
    steps: int
    stats: TableStats
    snapshot: TableSnapshot
    errors: Sequence = field(default_factory=list)
    image_columns: tuple[str, ...] = ()
    stream: EpochStream | None = None
    rows: int = 0
    padded_rows: int = 0
    weighted: bool = False

    def start_at(self, global_step: int) -> None:
        """Start the next read of the dataset after ``global_step`` training steps run on this
        split's ranks and batch.

        The epoch's rows are read again (same seed, same order) and the batches those steps
        consumed are dropped before they reach tf.data, so a resumed run continues exactly
        where it stopped. Call it before the dataset is iterated (before ``fit``).
        """
        self.stream.start_at(global_step)

    def resume_from(self, position: EpochPosition) -> Resume:
        """Start the next read where ``position`` (a checkpoint's, from any number of ranks)
        says: the rest of its epoch's rows, each once (see :mod:`keras_dl.data.stream.epoch_position`)."""
        return self.stream.resume_from(position)

    def record(self, epoch: int, steps: int) -> EpochPosition:
        """The data position after ``steps`` steps of ``epoch`` (counted since the start)."""
        return self.stream.record(epoch, steps)

    def rows_seen(self, epoch: int) -> int:
        """Live rows of ``epoch`` this rank has handed to training so far (no padding)."""
        return self.stream.seen.get(epoch, 0)

    def batches(self, steps: int | None = None) -> Iterator:
        """The dataset's first ``steps`` batches (one epoch by default), iterated in Python.

        Raises:
            DataError: The reader's own error, when reading the split fails inside tf.data.
        """
        with original_errors(self):
            yield from self.dataset.take(self.steps if steps is None else steps)

    def original_error(self, exc: BaseException) -> BaseException | None:
        """The error behind ``exc``, which tf.data raised while reading this split, or None.

        That is the exception this split's generator raised, when ``exc`` carries its text (tf.data
        re-raises it as an ``UnknownError``); for an undecodable image, a DataError naming the
        file, row group and row (the table is re-scanned to find them).
        """
        if isinstance(exc, KerasDLError) or any(exc is e for e in self.errors):
            return None  # already the original
        text = str(exc)
        found = next((e for e in reversed(self.errors) if f"{type(e).__name__}: {e}" in text), None)
        if self.image_columns and _is_image_error(text):
            return self._bad_image(exc) or found
        return found

    def _bad_image(self, exc: BaseException):
        from keras_dl.data.tables.images import BAD_IMAGE_MARKER, bad_image_error, locate_bad_images

        text = str(exc)
        for column in self.image_columns:
            marked = f"{BAD_IMAGE_MARKER} column=" in text
            if marked and f"column={column}:" not in text:
                continue
            if locate_bad_images(self.snapshot, column, limit=1):
                return bad_image_error(self.snapshot, column, exc)
        return None


@contextlib.contextmanager
def original_errors(*splits: SplitData | None):
    """Within the block, an error tf.data raises while reading one of ``splits`` is raised as
    the original (see :meth:`SplitData.original_error`); other errors pass unchanged."""
    try:
        yield
    except Exception as exc:
        for split in splits:
            original = None if split is None else split.original_error(exc)
            if original is not None:
                raise original from None  # its own traceback, from inside the generator
        raise


def make_dataset(
    snapshot: TableSnapshot,
    plan: ColumnPlan,
    options: ReadOptions,
    preprocess: Callable | None = None,
    *,
    stream: Callable[..., EpochStream] | None = None,
) -> SplitData:
    """Build the ``tf.data`` pipeline for one split of a table.

    Args:
        snapshot: The table (already filtered to the split).
        plan: Feature and label columns.
        options: Batch size, sharding and shuffling.
        preprocess: Optional ``fn(features, label) -> (features, label)`` run on whole batches
            inside tf.data (vectorized, parallel). Defaults to None.
        stream: Makes the split's stream, called as ``stream(snapshot, plan, options,
            preprocess)``; the benchmarks pass one that reads or times differently (an
            :class:`~keras_dl.data.stream.epoch_stream.EpochStream` given ``reads``, or a
            subclass). Defaults to None: ``EpochStream``.

    Returns:
        The dataset, its steps per epoch (equal on every shard) and the table's stats.

    Raises:
        DataError: When the split is empty, or has fewer live rows than shards.
    """
    stream = (EpochStream if stream is None else stream)(snapshot, plan, options, preprocess)
    return SplitData(
        dataset=stream_dataset(stream, options.batch_size),
        steps=stream.steps,
        stats=stream.stats,
        snapshot=snapshot,
        errors=stream.errors,
        image_columns=tuple(f.name for f in plan.features if f.kind == BINARY),
        stream=stream,
        rows=stream.rows,
        padded_rows=stream.total - stream.rows,
        weighted=stream.weighted,
    )


def make_mixed_dataset(
    names: Sequence[str],
    snapshots: Sequence[TableSnapshot],
    weights: Sequence[float],
    plan: ColumnPlan,
    options: ReadOptions,
    epoch_rows: int | None = None,
    preprocess: Callable | None = None,
) -> SplitData:
    """The training pipeline of a split mixed from several tables by weight
    (:class:`~keras_dl.data.stream.mix_stream.MixStream`); ``stats`` and ``snapshot`` are the
    first source's, ``stream.rows_by_source(epoch)`` counts each source's rows trained.

    Raises:
        DataError: A source of weight > 0 without live rows, or fewer rows than ranks.
    """
    stream = MixStream(names, snapshots, weights, plan, options, epoch_rows, preprocess)
    return SplitData(
        dataset=stream_dataset(stream, options.batch_size),
        steps=stream.steps,
        stats=stream.stats,
        snapshot=stream.snapshot,
        errors=stream.errors,
        image_columns=tuple(f.name for f in plan.features if f.kind == BINARY),
        stream=stream,
        rows=stream.rows,
        padded_rows=stream.total - stream.rows,
        weighted=stream.weighted,
    )


def stream_dataset(stream: EpochStream, batch_size: int):
    """The ``tf.data.Dataset`` of ``stream``'s batches (its hook, if any, run in tf.data)."""
    import tensorflow as tf

    # lifecycle: the generator ends at its next step when the interpreter exits.
    generate = shutdown.guard_generator(stream.generate)
    ds = tf.data.Dataset.from_generator(generate, output_signature=stream.signature)
    # Let the (Python) generator run ahead of slicing and preprocessing, on its own thread.
    # Each block's batches are handed out by ``from_tensor_slices``, whose slices alias the
    # block (no copy); ``rebatch`` and ``unbatch`` copy every slice.
    ds = ds.prefetch(2).flat_map(_slices)
    if stream.in_graph is not None:
        # A vectorized hook costs per call more than per row (image decoding runs a map_fn per
        # call): run it on chunks of at least PREPROCESS_ROWS rows, then cut the batches,
        # keeping each epoch's last partial batch its own.
        hook = _with_weights(stream.in_graph) if stream.weighted else stream.in_graph
        ds = ds.map(hook, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.flat_map(_batches(batch_size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    opts = tf.data.Options()
    # Sharding is done by rows in the reader: tf.distribute must not shard again.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(opts)


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
                    tf.shape(tf.nest.flatten(label)[0])[0],  # several labels: a dict
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


def _is_image_error(text: str) -> bool:
    from keras_dl.data.tables.images import BAD_IMAGE_MARKER

    return BAD_IMAGE_MARKER in text or any(
        m in text for m in ("Unknown image file format", "Invalid JPEG", "Invalid PNG", "jpeg::")
    )


__all__ = [
    "EpochPosition",
    "ReadOptions",
    "SplitData",
    "make_dataset",
    "make_mixed_dataset",
    "original_errors",
    "stream_dataset",
]
