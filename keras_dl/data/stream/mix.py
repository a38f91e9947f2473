"""The plan of a mixed epoch: several sources' rows by weight, exact and resumable (no I/O, no TF).

A mixed epoch holds ``epoch_rows`` rows (default: every source's live rows together). Its rows
are planned in three steps, each seeded by ``(seed, epoch)`` so the same config gives the same
rows in the same order on every rank and in a resumed run:

1. **Shares** (:func:`shares`). Source ``s`` gets ``epoch_rows * w_s / sum(w)`` rows, rounded by
   the *largest remainder* rule: every share is first rounded down, then the rows left over go
   one each to the sources with the largest fractional parts (ties: the earlier source). The
   shares sum exactly to ``epoch_rows``. Weights are read as the decimals they print as
   (``0.7`` is 7/10), so ``0.7/0.3`` of 10 rows is 7 and 3.
2. **Draws** (:class:`SourceDraws`). Source ``s``'s share is drawn from its live rows (numbered
   as :mod:`~keras_dl.data.stream.row_ranges` numbers a split's rows) as whole *passes* over
   them, then a remainder: draw ``d`` is in pass ``d // n_s``. Each pass visits every live row
   once, so no row comes twice within a pass and the remainder holds distinct rows; a source
   larger than its share is read ``share`` rows of one pass, sampled anew each epoch. A pass
   visits the source's files in a seeded order, rotated by a seeded row offset (as
   :mod:`~keras_dl.data.stream.shards` plans one table), so any run of draws is a few runs of
   row ids: a rank reads only the row groups that hold its draws.
3. **Slots** (:func:`slot_sources`). The epoch's ``epoch_rows`` positions are given to the
   sources in a seeded permutation of ``share_s`` copies of each source (without shuffling: an
   even interleave), and source ``s``'s ``k``-th position holds its ``k``-th draw. Rank ``r`` of
   ``R`` takes one contiguous run of positions, ``N // R`` rows or one more (as row-exact shards
   do for one table), so each rank trains the mix, every rank runs the same steps (padding at
   weight 0), and its rows of each source are one run of that source's draws. Within a rank,
   consecutive pools of ``buffer`` positions are permuted (seeded), the in-memory shuffle.

A stop mid-epoch is an :class:`~keras_dl.data.stream.epoch_position.EpochPosition` (segments of
``(ranks, batch, steps)``): :meth:`MixRows.trained` replays the plans to find each source's
draws already trained, a few runs of draw indices per source (:meth:`MixRows.trained_counts`
gives the rows per source). A resume on the same ranks and batch continues its plan; on any
other, the draws not trained are planned anew over the new ranks (per source the remaining
counts, interleaved by a seed that also counts the segments before), so the interrupted epoch
trains each source's share exactly once, as a single table's epoch does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from keras_dl.data.stream import row_ranges as rr
from keras_dl.data.stream.epoch_position import EpochPosition, Resume, Segment
from keras_dl.data.stream.mix_draws import SourceDraws, ordinals, shares, slot_sources
from keras_dl.data.stream.shards import rng_seed, shard_sizes


@dataclass(frozen=True)
class MixLayout:
    """How one segment of a mixed epoch is planned: ``ranks`` shards of the epoch's draws
    (``rest`` None) or of the draws ``rest`` (per source, a set of draw indices) left;
    ``depth`` segments came before it (it seeds the plan)."""

    ranks: int
    rest: tuple[rr.Runs, ...] | None = None
    depth: int = 0


@dataclass(frozen=True)
class RankMix:
    """One rank's rows of one segment of a mixed epoch.

    Attributes:
        sources: The source of each of the rank's rows, in read (pre-shuffle) order.
        draws: Per source, the draw indices it reads, ascending: its ``k``-th row of source
            ``s`` is the ``k``-th of ``draws[s]``.
        order: The shuffle: output row ``i`` is read row ``order[i]`` (None: not shuffled).
    """

    sources: np.ndarray
    draws: tuple[rr.Runs, ...]
    order: np.ndarray | None

    @property
    def rows(self) -> int:
        return len(self.sources)

    def trained(self, rows: int) -> tuple[rr.Runs, ...]:
        """Per source, the draw indices of the rank's first ``rows`` output rows."""
        picked = np.arange(min(rows, self.rows)) if self.order is None else self.order[:rows]
        local = ordinals(self.sources)[picked]
        out = []
        for s, draws in enumerate(self.draws):
            mine = np.sort(local[self.sources[picked] == s])
            out.append(rr.from_ids(rr.to_ids(draws)[mine]) if len(mine) else rr.EMPTY.copy())
        return tuple(out)

    def output(self) -> list[tuple[int, int]]:
        """``(source, draw index)`` of every output row, in order (for tests and counts)."""
        ids = [rr.to_ids(d) for d in self.draws]
        local = ordinals(self.sources)
        read = [(int(s), int(ids[s][k])) for s, k in zip(self.sources, local)]
        return read if self.order is None else [read[i] for i in self.order]


class MixRows:
    """The plans of a mixed training split and what their steps trained (module docstring).

    Args:
        file_rows: Per source, its live rows per file, in snapshot order.
        weights: Per source, its weight.
        epoch_rows: Rows per epoch (None: every source's rows together).
        shuffle: Whether training shuffles (seeded passes, slots and pools).
        seed: ``data.seed``.
        buffer: Rows per shuffle pool of a rank (0: not mixed within the rank).
    """

    def __init__(
        self,
        file_rows: Sequence[Sequence[int]],
        weights: Sequence[float],
        epoch_rows: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        buffer: int = 0,
    ):
        self.file_rows = tuple(tuple(int(r) for r in f) for f in file_rows)
        self.rows = [sum(f) for f in self.file_rows]
        self.weights = tuple(float(w) for w in weights)
        self.shares = shares(self.rows, weights, epoch_rows)
        self.total = sum(self.shares)
        self.shuffle, self.seed = shuffle, int(rng_seed(seed))
        self.buffer = buffer if shuffle else 0
        self._draws: dict[tuple[int, int], SourceDraws] = {}

    def draws(self, epoch: int, source: int) -> SourceDraws:
        """Source ``source``'s draws in ``epoch``."""
        key = (epoch, source)
        if key not in self._draws:
            if len(self._draws) > 4 * len(self.shares):
                self._draws.clear()  # keep a few epochs: plans are cheap to rebuild
            self._draws[key] = SourceDraws(
                self.file_rows[source],
                self.shares[source],
                shuffle=self.shuffle,
                seed=[self.seed, epoch, source],
            )
        return self._draws[key]

    def counts(self, layout: MixLayout) -> list[int]:
        """Per source, the draws ``layout`` plans."""
        if layout.rest is None:
            return list(self.shares)
        return [rr.count(r) for r in layout.rest]

    def sizes(self, layout: MixLayout) -> list[int]:
        """Rows of each shard of ``layout``."""
        return shard_sizes(sum(self.counts(layout)), layout.ranks)

    def steps(self, layout: MixLayout, batch: int) -> int:
        """Batches of ``batch`` rows the largest shard of ``layout`` needs (every rank runs it)."""
        return math.ceil(max(self.sizes(layout)) / batch)

    def rank(self, epoch: int, layout: MixLayout, shard: int) -> RankMix:
        """Shard ``shard``'s rows of ``epoch`` under ``layout``."""
        counts = self.counts(layout)
        slots = slot_sources(counts, self.shuffle, [self.seed, epoch, layout.depth, 1])
        sizes = shard_sizes(len(slots), layout.ranks)
        lo = sum(sizes[:shard])
        before = np.bincount(slots[:lo], minlength=len(counts))
        mine = slots[lo : lo + sizes[shard]]
        here = np.bincount(mine, minlength=len(counts))
        draws = []
        for s in range(len(counts)):
            avail = rr.runs([(0, counts[s])]) if layout.rest is None else layout.rest[s]
            draws.append(rr.slice_by_rank(avail, int(before[s]), int(before[s] + here[s])))
        order = None
        if self.buffer > 0 and len(mine):
            seed = [self.seed, shard, epoch, layout.depth]
            order = np.concatenate(
                [
                    a
                    + np.random.default_rng([*seed, i]).permutation(min(self.buffer, len(mine) - a))
                    for i, a in enumerate(range(0, len(mine), self.buffer))
                ]
            )
        return RankMix(mine.copy(), tuple(draws), order)

    def trained(self, epoch: int, segments: Sequence[Segment]) -> tuple[rr.Runs, ...]:
        """Per source, the draw indices ``segments`` of ``epoch`` trained, over all ranks."""
        trained = tuple(rr.EMPTY.copy() for _ in self.shares)
        rest = None
        for depth, seg in enumerate(segments):
            layout = MixLayout(seg.ranks, rest, depth)
            sizes = self.sizes(layout)
            for s in range(seg.ranks):
                part = self.rank(epoch, layout, s).trained(min(seg.steps * seg.batch, sizes[s]))
                trained = tuple(rr.union(t, p) for t, p in zip(trained, part))
            rest = tuple(rr.complement(t, n) for t, n in zip(trained, self.shares))
        return trained

    def trained_counts(self, epoch: int, segments: Sequence[Segment]) -> list[int]:
        """Per source, the rows ``segments`` of ``epoch`` trained, over all ranks."""
        return [rr.count(t) for t in self.trained(epoch, segments)]

    def resume(self, position: EpochPosition, ranks: int, batch: int) -> Resume:
        """Where an attempt on ``ranks`` ranks of ``batch`` rows continues from ``position``
        (an :class:`~keras_dl.data.stream.epoch_position.EpochPosition`), as a
        :class:`~keras_dl.data.stream.epoch_position.Resume` whose layout is a :class:`MixLayout`."""
        epoch, segs = position.epoch, position.segments
        fresh = Resume(
            epoch, MixLayout(ranks), steps=self.steps(MixLayout(ranks), batch), batch=batch
        )
        if not segs:
            return fresh
        last = segs[-1]
        if (last.ranks, last.batch) == (ranks, batch):  # continue the last segment's plan
            prefix = segs[:-1]
            rest = self._rest(self.trained(epoch, prefix)) if prefix else None
            layout = MixLayout(ranks, rest, len(prefix))
            before = self.total - sum(self.counts(layout))
            before += sum(min(last.steps * batch, n) for n in self.sizes(layout))
            steps = self.steps(layout, batch) - last.steps
            resumed = Resume(epoch, layout, last.steps, prefix, before, steps, batch)
        else:  # a new plan over the draws not trained yet
            trained = self.trained(epoch, segs)
            layout = MixLayout(ranks, self._rest(trained), len(segs))
            before = sum(rr.count(t) for t in trained)
            steps = self.steps(layout, batch) if before < self.total else 0
            resumed = Resume(epoch, layout, 0, segs, before, steps, batch)
        if before >= self.total or resumed.steps <= 0:  # the epoch was done: start the next
            return Resume(epoch + 1, MixLayout(ranks), steps=fresh.steps, batch=batch)
        return resumed

    def _rest(self, trained: Sequence[rr.Runs]) -> tuple[rr.Runs, ...]:
        return tuple(rr.complement(t, n) for t, n in zip(trained, self.shares))


__all__ = ["MixLayout", "MixRows", "RankMix", "SourceDraws", "shares", "slot_sources"]
