"""One rank's epochs of a training split mixed from several tables, as blocks of whole batches.

:class:`MixStream` is :class:`~keras_dl.data.stream.epoch_stream.EpochStream`'s counterpart for
``data.sources``: which rows each epoch holds is planned by :mod:`keras_dl.data.stream.mix`
(each source's exact share, drawn without replacement, interleaved and split row-exactly over
the ranks); each source's rows are read by the same Petastorm reader machinery as one table's
(:func:`~keras_dl.data.stream.shard_epochs.read_pieces`: its own snapshot, version, filters and
deletion vectors), in draw order, and put in the positions the plan gives them, then each
shuffle pool is permuted. Weights, padding to equal steps and blocks are those of a single
table's stream (:mod:`keras_dl.data.stream.blocks`). With ``data.cache=auto``, each source
that fits what is left of ``data.cache_max_bytes`` is read whole once and its draws gathered
from memory after (:mod:`keras_dl.data.stream.mix_cache`); a recipe's preprocess hook runs in
tf.data.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from keras_dl.data.stream.arrays import to_arrays
from keras_dl.data.stream.blocks import as_block, cut_blocks, num_rows, trim, weigh_and_pad
from keras_dl.data.stream.epoch_position import EpochPosition, Resume, Segment
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.mix import MixLayout, MixRows, RankMix
from keras_dl.data.stream.mix_ahead import PlanAhead
from keras_dl.data.stream.mix_cache import SourceCaches
from keras_dl.data.stream.mix_chunks import Rows, place, unique_runs
from keras_dl.data.stream.read_options import ReadOptions
from keras_dl.data.stream.shard_epochs import RowGroupCounts, epoch_pieces, read_pieces
from keras_dl.data.stream.shards import ShardPlan, plan_pieces
from keras_dl.data.stream.shutdown import ReadersClosed
from keras_dl.data.stream.signature import input_signature, to_structure
from keras_dl.data.tables.stats import count_rows
from keras_dl.errors import DataError

CHUNK_ROWS = 4096  # rows put in place at once when the pools are not shuffled


class MixStream:
    """One shard's epochs of a mixed training split (the public methods of ``EpochStream``
    that training uses: :meth:`generate`, :meth:`resume_from`, :meth:`record`,
    :meth:`start_at`, :meth:`close`, and :meth:`rows_by_source`).

    Args:
        names: Each source's name.
        snapshots: Each source's snapshot (filtered, at its version).
        weights: Each source's weight.
        plan: The column plan every source shares.
        options: The training read options (batch, shard, shuffle, seed).
        epoch_rows: Rows per epoch (None: every source's rows together).
        preprocess: A vectorized hook, run in tf.data on the batches.

    Raises:
        DataError: A source without live rows but with a weight, or fewer rows per epoch
            than ranks.
    """

    def __init__(
        self,
        names: Sequence[str],
        snapshots: Sequence,
        weights: Sequence[float],
        plan: ColumnPlan,
        options: ReadOptions,
        epoch_rows: int | None = None,
        preprocess=None,
    ):
        self.names, self.snapshots, self.plan, self.options = tuple(names), snapshots, plan, options
        self.snapshot = snapshots[0]
        self.all_stats = [count_rows(s, plan.columns) for s in snapshots]
        self.stats = self.all_stats[0]
        for name, snap, stats, w in zip(names, snapshots, self.all_stats, weights):
            if w > 0 and stats.rows == 0:
                raise DataError(
                    f"data.sources {name!r}: table {snap.uri!r} (version {snap.version}) has no "
                    "live rows to draw its share from. Check its filters and version, or give "
                    "it weight 0."
                )
        self.shuffle = options.shuffle
        self.mix = MixRows(
            [s.file_rows for s in self.all_stats],
            weights,
            epoch_rows,
            shuffle=self.shuffle,
            seed=options.seed,
            buffer=options.shuffle_buffer if self.shuffle else 0,
        )
        if self.mix.total < options.num_shards:
            raise DataError(
                f"data.sources: an epoch of {self.mix.total} row(s) cannot fill "
                f"{options.num_shards} ranks. Raise data.epoch_rows or run on fewer ranks."
            )
        self.groups = [
            RowGroupCounts(s, st, plan.columns, options.io.concurrency)
            for s, st in zip(snapshots, self.all_stats)
        ]
        layout = MixLayout(options.num_shards)
        self.steps = self.mix.steps(layout, options.batch_size)
        self.rows = self.mix.sizes(layout)[options.shard]
        padded = options.num_shards > 1 or options.pad
        self.weighted = plan.label is not None and (padded or plan.weighs_rows)
        self._padded = padded and self.weighted
        self.total = self.steps * options.batch_size if self._padded else self.rows
        self.resume = Resume(0, layout, steps=self.steps, batch=options.batch_size)
        # Per source, the rows of the resumed epoch trained before this attempt, over all ranks.
        self.sources_before: dict[int, dict[str, int]] = {}
        self.seen: dict[int, int] = {}
        self._handed: dict[int, tuple[np.ndarray, int, int]] = {}  # epoch: (labels, from, to)
        self.errors: deque = deque(maxlen=4)
        self._rank: tuple | None = None  # (epoch, layout, RankMix) last planned
        self._ahead = PlanAhead(
            lambda e, lay: self.mix.rank(e, lay, options.shard), self._layout, _same_layout
        )  # the next epoch's plan, made while this one streams
        self.pack = lambda values: to_structure(values, plan)
        self.signature = input_signature(plan, blocked=True, weighted=self.weighted)
        self.in_graph = preprocess
        self.caches = SourceCaches(options.cache_max_bytes, len(snapshots), options.batch_size)

    # -- position ----------------------------------------------------------------------------
    def resume_from(self, position: EpochPosition) -> Resume:
        """Start :meth:`generate` where ``position`` says, on this stream's ranks and batch."""
        o = self.options
        self.resume = self.mix.resume(position, o.num_shards, o.batch_size)
        self.sources_before = {}
        if self.resume.epoch == position.epoch and position.segments:
            counts = self.mix.trained_counts(position.epoch, position.segments)
            self.sources_before = {position.epoch: dict(zip(self.names, counts))}
        return self.resume

    def record(self, epoch: int, steps: int) -> EpochPosition:
        """The position after ``steps`` steps of ``epoch`` (counted since this stream started)."""
        return self.resume.record(epoch, steps)

    def start_at(self, global_step: int) -> None:
        """Start after ``global_step`` steps run on this stream's ranks and batch."""
        o = self.options
        epoch, step = divmod(int(global_step), max(self.steps, 1))
        segments = (Segment(o.num_shards, o.batch_size, step),) if step else ()
        self.resume_from(EpochPosition(epoch, segments))

    def rows_by_source(self, epoch: int) -> dict[str, int]:
        """This rank's live rows of each source handed to training in ``epoch`` (no padding)."""
        if epoch not in self._handed:
            return dict.fromkeys(self.names, 0)
        labels, lo, hi = self._handed[epoch]
        counts = np.bincount(labels[lo:hi], minlength=len(self.names))
        return {n: int(c) for n, c in zip(self.names, counts)}

    # -- reading -----------------------------------------------------------------------------
    def rank(self, epoch: int) -> RankMix:
        """This shard's plan of ``epoch`` (the last one asked for is kept: an epoch asks twice)."""
        layout = self._layout(epoch)
        kept = self._rank
        if kept is None or kept[0] != epoch or not _same_layout(kept[1], layout):
            self._rank = kept = (epoch, layout, self._ahead.take(epoch, layout))
        return kept[2]

    def chunks(self, epoch: int) -> Iterator[dict]:
        """``epoch``'s rows of this shard, mixed, as chunks (the shuffle pools permuted)."""
        rank = self.rank(epoch)
        if rank.rows == 0:
            yield from self._pad_source()
            return
        readers = [
            Rows(self._read(epoch, s, draws)) if len(draws) else None
            for s, draws in enumerate(rank.draws)
        ]
        step = self._chunk_rows()
        for lo in range(0, rank.rows, step):
            labels = rank.sources[lo : lo + step]
            parts = {
                int(s): readers[int(s)].take(int((labels == s).sum())) for s in np.unique(labels)
            }
            order = rank.order[lo : lo + step] - lo if rank.order is not None else None
            yield place(labels, parts, order)

    def epoch(self, epoch: int, skip: int = 0):
        """An epoch's chunks with weights and padding (when weighted), after ``skip`` rows."""
        chunks = self.chunks(epoch)
        rows, total = self.sizes(epoch)
        if self.weighted:
            chunks = weigh_and_pad(chunks, rows, total)
        chunks = trim(chunks, skip) if skip else chunks
        rank = self.rank(epoch)
        labels = rank.sources if rank.order is None else rank.sources[rank.order]
        self._handed[epoch] = (labels, skip, skip)
        self.seen.setdefault(epoch, 0)
        at = skip
        for arrays in chunks:
            n = num_rows(arrays)
            live = max(0, min(at + n, rows) - min(at, rows))
            self.seen[epoch] += live
            at += n
            self._handed[epoch] = (labels, skip, min(at, rows))
            yield arrays

    def sizes(self, epoch: int) -> tuple[int, int]:
        """This shard's live rows in ``epoch``, and with its padding."""
        layout = self._layout(epoch)
        rows = self.mix.sizes(layout)[self.options.shard]
        steps = self.mix.steps(layout, self.options.batch_size)
        return rows, (steps * self.options.batch_size if self._padded else rows)

    def generate(self):
        """The blocks of batches of every epoch from :attr:`resume`, epoch after epoch."""
        try:
            epoch = self.resume.epoch
            skip = self.resume.skip_steps * self.options.batch_size
            while True:
                carry = None
                for arrays in self.epoch(epoch, skip):
                    blocks, carry = cut_blocks(arrays, carry, self.options.batch_size)
                    if blocks is not None:
                        yield self.pack(blocks)
                if carry is not None:
                    yield self.pack(as_block(carry))
                epoch, skip = epoch + 1, 0
        except ReadersClosed:  # lifecycle: the interpreter is exiting, not an error
            raise
        except Exception as exc:  # tf.data raises its text in an UnknownError: keep the original
            self.errors.append(exc)
            raise

    def close(self) -> None:
        """Nothing is read ahead: the readers stop with their generators."""

    def _chunk_rows(self) -> int:
        """Rows per chunk: whole shuffle pools (each is permuted within itself), about a row
        group of the sources' (the smaller one's), as a single table's stream hands over a
        row group at a time: fewer, larger blocks cost tf.data less per row."""
        pool = self.mix.buffer if self.mix.buffer > 0 else CHUNK_ROWS
        group = min(_group_rows(g) for g in self.groups)
        return pool * max(1, group // pool)

    def _layout(self, epoch: int) -> MixLayout:
        if epoch == self.resume.epoch:
            return self.resume.layout
        return MixLayout(self.options.num_shards)

    def _read(self, epoch: int, source: int, draws) -> Iterator[dict]:
        """Source ``source``'s rows of ``draws`` (draw indices), in draw order, as arrays."""
        stats, draws_of = self.all_stats[source], self.mix.draws(epoch, source)
        offsets = np.concatenate([[0], np.cumsum(stats.file_rows, dtype=np.int64)])
        pieces = []
        for a, b in draws.tolist():
            for lo, hi in draws_of.runs(int(a), int(b)):
                f = int(np.searchsorted(offsets, lo, side="right")) - 1
                base = int(offsets[f])
                plan = ShardPlan(0, 1, ((f, ((lo - base, hi - base),)),), hi - lo)
                pieces.extend(plan_pieces(plan, self.groups[source]))
        return self._arrays(source, pieces)

    def _arrays(self, source: int, pieces) -> Iterator[dict]:
        """Source ``source``'s rows of ``pieces``, in order: from memory when it is kept (its
        whole split read once, the first time, to fill its cache)."""
        snap, stats, groups = self.snapshots[source], self.all_stats[source], self.groups[source]
        whole = lambda: self._pieces(source, epoch_pieces(snap, stats, groups=groups))  # noqa: E731
        cached = self.caches.rows(source, pieces, whole)
        if cached is not None:
            return cached
        return (arrays for _, arrays in self._pieces(source, pieces))

    def _pieces(self, source: int, pieces) -> Iterator[tuple]:
        """``(piece, arrays)`` of ``pieces`` read from the source's table."""
        snapshot, plan = self.snapshots[source].with_local_copies(), self.plan

        def convert(table, file: int, row_group: int):
            where = f", file {snapshot.files[file]!r}, row group {row_group}"
            return to_arrays(table, plan, snapshot, where)

        o = self.options
        for part in unique_runs(pieces):
            yield from read_pieces(
                snapshot, plan.columns, part, o.workers, convert=convert, io=o.io
            )

    def _pad_source(self) -> Iterator[dict]:
        """One row to copy as padding, for a shard a resume left without rows of its own."""
        source = next(s for s, n in enumerate(self.mix.shares) if n > 0)
        draws = self.mix.draws(self.resume.epoch, source)
        lo, hi = draws.runs(0, 1)[0]
        offsets = np.concatenate([[0], np.cumsum(self.all_stats[source].file_rows)])
        f = int(np.searchsorted(offsets, lo, side="right")) - 1
        base = int(offsets[f])
        plan = ShardPlan(0, 1, ((f, ((lo - base, hi - base),)),), 1)
        return self._arrays(source, plan_pieces(plan, self.groups[source]))


def _same_layout(a: MixLayout, b: MixLayout) -> bool:
    """Whether two layouts plan the same rows: the same object, or whole epochs alike."""
    return a is b or (
        a.rest is None and b.rest is None and (a.ranks, a.depth) == (b.ranks, b.depth)
    )


def _group_rows(groups: RowGroupCounts) -> int:
    """A source's rows per row group: the largest of its first file's (its footer is read
    for the epoch anyway)."""
    return max(groups(0), default=0) if groups.stats.files else 0


__all__ = ["MixStream"]
