"""One shard's epochs of one split, as blocks of whole batches for ``from_generator``.

:class:`EpochStream` decides which rows each epoch holds (the shard planner's pieces), reads them
with Petastorm (the next epoch's reader opened ahead) or replays them from the memory cache,
mixes them in the shuffle buffer, weighs and pads them to equal steps on every shard, and cuts
them into blocks of whole batches. It is plain Python and numpy: :mod:`keras_dl.data.stream.tfdata`
turns its blocks into a ``tf.data.Dataset``, and the benchmarks drive its public methods.

Every training epoch holds every live row of the split exactly once, across all shards, and
keeps its last partial batch (Keras' own default). With several shards (or ``pad``), every
shard runs the same ``steps``: a shard with fewer rows pads its last batch with copies of its
rows whose sample weight is 0, so the padding moves no gradient and no weighted metric.
Evaluation yields every row once, the last batch partial.
"""

from __future__ import annotations

import math
from collections import deque

from keras_dl.data.stream.arrays import to_arrays
from keras_dl.data.stream.blocks import (
    as_block,
    cut_blocks,
    gather,
    num_rows,
    rows_per_gather,
    trim,
    weigh_and_pad,
)
from keras_dl.data.stream.epoch_position import EpochPosition, EpochRows, Layout, Resume, Segment
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.memory_cache import EpochCache
from keras_dl.data.stream.next_epoch import ReadAhead
from keras_dl.data.stream.preprocess_hook import cacheable_hook
from keras_dl.data.stream.read_options import ReadOptions, steps_per_epoch
from keras_dl.data.stream.shard_epochs import RowGroupCounts, epoch_pieces, read_pieces
from keras_dl.data.stream.shuffle import shuffle_rows
from keras_dl.data.stream.shutdown import ReadersClosed
from keras_dl.data.stream.signature import input_signature, to_structure
from keras_dl.data.stream.unischema_epochs import iter_unischema_rows
from keras_dl.data.tables.stats import count_rows
from keras_dl.errors import ConfigError, DataError

PREPROCESS_ROWS = 128
ERRORS_KEPT = 4  # the newest errors a stream's generators raised


class EpochStream:
    """One shard's epochs of one split, as blocks of whole batches for ``from_generator``.

    Public methods: :meth:`pieces` (which row groups an epoch reads), :meth:`chunks` (an
    epoch's rows, mixed), :meth:`epoch` (weighted and padded, from a step on),
    :meth:`generate` (the blocks, epoch after epoch when training), :meth:`resume_from` (start
    where a checkpoint's position says, on any number of ranks), :meth:`record` (the position
    after some steps) and :meth:`close` (stop a reader opened ahead, after reading epochs with
    :meth:`chunks` or :meth:`epoch`).

    ``reads``: how a table's epochs read their row groups, called as
    :func:`~keras_dl.data.stream.shard_epochs.read_pieces` (the default) is; the benchmarks
    pass another (a plain thread pool, a timed load).

    Attributes:
        steps: Batches per epoch, equal on every shard.
        rows: This shard's live rows per epoch; ``total``: with the padding rows.
        weighted: The blocks carry sample weights (the last element of each).
        signature: The TensorSpecs of one block (:meth:`generate`'s items).
        in_graph: The preprocess hook tf.data must run on the batches, or None (no hook, or
            the hook runs here and the memory cache keeps its output).
        resume: Where :meth:`generate` starts: an epoch, its plan and the steps of it skipped.
        seen: Live rows (padding not counted) handed out per epoch by :meth:`generate`.
        errors: The last exceptions :meth:`generate` raised, the newest last: tf.data hands
            its consumer a copy of their text, and :mod:`keras_dl.data.stream.tfdata` the originals.
    """

    def __init__(
        self, snapshot, plan: ColumnPlan, options: ReadOptions, preprocess=None, reads=None
    ):
        self.snapshot, self.plan, self.options = snapshot, plan, options
        self._read_pieces = read_pieces if reads is None else reads
        self.stats = count_rows(snapshot, plan.columns)
        self.steps = steps_per_epoch(snapshot, self.stats, options)
        self.shuffle = options.training and options.shuffle
        padded = options.training and (options.num_shards > 1 or options.pad)
        self.weighted = plan.label is not None and (padded or plan.weighs_rows)
        self._padded = padded and self.weighted
        self.rows = self.stats.shard_rows(options.shard, options.num_shards)
        self.total = self.steps * options.batch_size if self._padded else self.rows
        self.groups = RowGroupCounts(snapshot, self.stats, plan.columns, options.io.concurrency)
        self.rows_of = EpochRows(
            self.stats.file_rows,
            self.groups,
            shuffle=self.shuffle,
            seed=options.seed,
            buffer=options.shuffle_buffer,
        )
        self.resume = Resume(
            0, Layout(options.num_shards), steps=self.steps, batch=options.batch_size
        )
        self.seen: dict[int, int] = {}
        self.errors: deque = deque(maxlen=ERRORS_KEPT)
        table = not snapshot.read_by_rows  # a Unischema dataset is read row by row
        if not table and plan.weighs_rows:
            raise DataError(
                f"Petastorm dataset {snapshot.uri!r}: data.weight_column and train.class_weight "
                "are read from Delta and Parquet tables only. Unset them for this dataset."
            )
        self.cache = EpochCache(options.cache_max_bytes if table else 0)
        # Rows per call of the preprocess hook: whole batches, at least PREPROCESS_ROWS.
        batch = options.batch_size
        self.hook_rows = batch * max(1, math.ceil(PREPROCESS_ROWS / batch))
        raw = input_signature(plan)
        self.hook = cacheable_hook(preprocess, raw, self.stats.rows, self.cache.max_bytes)
        if self.hook is None:
            self.pack = lambda values: to_structure(values, plan)
            self.signature = input_signature(plan, blocked=True, weighted=self.weighted)
            self.in_graph = preprocess
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
        """The row groups (and masks) this shard reads in ``epoch``, in order (for a shard
        left without rows by a resume, the one row it copies as padding)."""
        # One planner for the read and for a resume's replay of it (EpochRows.pieces): the
        # rows a resume finds trained are the rows this read handed out.
        layout = self._layout(epoch)
        pieces = self.rows_of.pieces(epoch, layout, self.options.shard)
        return pieces or self.rows_of.pad_pieces(layout)

    def resume_from(self, position: EpochPosition) -> Resume:
        """Start :meth:`generate` where ``position`` says (see :mod:`keras_dl.data.stream.epoch_position`).

        On the ranks and batch of the position's last segment, the epoch continues its plan; on
        others, the rows of the epoch not yet trained are planned anew over this attempt's ranks.

        Raises:
            ConfigError: For a Petastorm (Unischema) dataset resumed mid-epoch on other ranks or
                another batch: its rows are read one by one, not by row group.
        """
        o = self.options
        if not o.training:
            raise ValueError("only a training split resumes")
        resume = self.rows_of.resume(position, o.num_shards, o.batch_size)
        if resume.moved and self.snapshot.read_by_rows:
            last = position.segments[-1]
            raise ConfigError(
                f"Petastorm dataset {self.snapshot.uri!r}: its checkpoint stopped in epoch "
                f"{position.epoch + 1} on {last.ranks} rank(s) of {last.batch} rows, and a "
                "Petastorm (Unischema) dataset resumes mid-epoch only on the same ranks and "
                f"batch. Rerun with runtime.np giving {last.ranks} process(es) and the same "
                "train.batch_size, or convert the dataset to a Delta table (keras-dl ingest)."
            )
        self.resume = resume
        return resume

    def record(self, epoch: int, steps: int) -> EpochPosition:
        """The position after ``steps`` steps of ``epoch`` (counted since this stream started)."""
        return self.resume.record(epoch, steps)

    def start_at(self, global_step: int) -> None:
        """Start after ``global_step`` steps run on this stream's ranks and batch."""
        o = self.options
        epoch, step = divmod(int(global_step), max(self.steps, 1))
        segments = (Segment(o.num_shards, o.batch_size, step),) if step else ()
        self.resume_from(EpochPosition(epoch, segments))

    def chunks(self, epoch: int):
        """Epoch ``epoch``'s rows of this shard, mixed by the shuffle buffer, as chunks."""
        o = self.options
        buffer = o.shuffle_buffer if self.shuffle else 0
        mix_seed = self.rows_of.mix_seed(epoch, self._layout(epoch), o.shard)
        if self.cache.ready or self._fill_from_whole_split():
            pieces = self.pieces(epoch)
            index = self.cache.order(pieces, buffer, mix_seed)
            if len(index) != sum(p.rows for p in pieces):
                raise DataError(
                    f"Table {self.snapshot.uri!r}: the cached epoch has {len(index)} rows where "
                    f"shard {o.shard} of {o.num_shards} holds {self.rows}. Report it."
                )
            columns = self.cache.columns
            return gather(columns, index, rows_per_gather(columns, self.block_rows))
        chunks = (arrays for _, arrays in self.reads(epoch))
        return shuffle_rows(chunks, buffer, mix_seed) if buffer > 0 else chunks

    def epoch(self, epoch: int, skip: int = 0):
        """An epoch's chunks with sample weights and padding (when weighted), after ``skip``.

        Rows keep the weights read with them (``data.weight_column``, class weights); the
        padding rows weigh 0."""
        chunks = self.chunks(epoch)
        rows, total = self.sizes(epoch)
        if self.weighted:
            chunks = weigh_and_pad(chunks, rows, total)
        chunks = trim(chunks, skip) if skip else chunks
        return self._count(chunks, epoch, skip, rows)

    def sizes(self, epoch: int) -> tuple[int, int]:
        """This shard's live rows in ``epoch``, and with its padding."""
        layout = self._layout(epoch)
        if layout.rest is None:
            return self.rows, self.total
        rows = self.rows_of.sizes(layout)[self.options.shard]
        steps = self.rows_of.steps(layout, self.options.batch_size)
        return rows, (steps * self.options.batch_size if self._padded else rows)

    def _count(self, chunks, epoch: int, at: int, rows: int):
        """Pass ``chunks`` on, counting in :attr:`seen` the live rows among them."""
        self.seen.setdefault(epoch, 0)
        for arrays in chunks:
            n = num_rows(arrays)
            self.seen[epoch] += max(0, min(at + n, rows) - min(at, rows))
            at += n
            yield arrays

    def _layout(self, epoch: int) -> Layout:
        if epoch == self.resume.epoch:
            return self.resume.layout
        return Layout(self.options.num_shards)

    def generate(self):
        """The blocks of batches of every epoch from :attr:`position` (one epoch to evaluate)."""
        try:
            epoch = self.resume.epoch
            skip = self.resume.skip_steps * self.options.batch_size
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
        except ReadersClosed:  # lifecycle: the interpreter is exiting, not an error
            raise
        except Exception as exc:  # tf.data raises its text in an UnknownError: keep the original
            self.errors.append(exc)
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Stop the next epoch's reader, when one was opened ahead and not taken."""
        self.reads.close()

    def _read(self, epoch: int, near_end=None):
        """``(piece, arrays)`` of one epoch, streamed (and kept when it is the whole split);
        ``near_end``: see :func:`~keras_dl.data.stream.shard_epochs.read_pieces`."""
        o = self.options
        if self.snapshot.read_by_rows:
            seed = o.seed + epoch if self.shuffle else None
            snapshot = self.snapshot.with_local_copies()
            args = (snapshot, self.plan, self.stats, o.shard, o.num_shards, self.shuffle)
            return ((None, a) for a in iter_unischema_rows(*args, seed, o.workers))
        pieces = self.pieces(epoch)
        chunks = self._arrays(pieces, near_end)
        if not self.cache.disabled and sum(p.rows for p in pieces) == self.stats.rows:
            chunks = self.cache.fill(chunks)  # kept only if every row group came whole
        return chunks

    def _arrays(self, pieces, near_end=None):
        """``(piece, arrays)`` of ``pieces``: each row group converted (and packed) by the
        reader's worker threads, beside the decoding, not on the thread that feeds tf.data.
        Each read takes the local copies ``data.cache_dir`` holds by then."""
        snapshot, plan = self.snapshot.with_local_copies(), self.plan

        def convert(table, file: int, row_group: int):
            where = f", file {snapshot.files[file]!r}, row group {row_group}"
            return to_arrays(table, plan, snapshot, where)

        o = self.options
        chunks = self._read_pieces(
            snapshot, plan.columns, pieces, o.workers, convert=convert, near_end=near_end, io=o.io
        )
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


__all__ = ["EpochPosition", "EpochStream", "ReadOptions", "steps_per_epoch"]
