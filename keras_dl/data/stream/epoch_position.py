"""Where a training epoch stopped, in terms any number of ranks can read, and the rest of it.

A training epoch is read in *segments*: the ranks of one attempt read it from where the last
attempt stopped. A segment is ``(ranks, batch per rank, steps)``, and an epoch's position is the
list of its segments (:class:`EpochPosition`): a few numbers, whatever the table's size. Because
every read is seeded (the shard planner, the piece order, each shuffle pool), the position names
exactly the rows those steps trained, and :class:`EpochRows` finds them again (as row ids,
:mod:`keras_dl.data.stream.row_ranges`) by replaying the plans, not the reads: which row groups each rank
read, and the permutation of the one pool each rank was in when it stopped.

A resume then continues the epoch:

- on the ranks and batch of the last segment, the same plan after the steps it ran (the epoch
  goes on exactly as if never stopped);
- on any other ranks or batch, a new plan over the rows not yet trained, split row-exactly
  (sizes within one row, equal steps, padding at weight 0).

Either way, every live row is trained once in the interrupted epoch. Later epochs are planned
as usual for the new ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from keras_dl.data.stream import row_ranges as rr
from keras_dl.data.stream.shards import (
    Piece,
    ShardPlan,
    plan_epoch,
    plan_pieces,
    rng_seed,
    shard_sizes,
)
from keras_dl.data.stream.shuffle import pool_bounds, pool_order


@dataclass(frozen=True)
class Segment:
    """Steps of one epoch run by ``ranks`` ranks of ``batch`` rows each, from one plan."""

    ranks: int
    batch: int
    steps: int


@dataclass(frozen=True)
class EpochPosition:
    """An epoch and the segments of it already trained (none: the epoch's start)."""

    epoch: int = 0
    segments: tuple[Segment, ...] = ()

    @property
    def steps(self) -> int:
        """Steps of the epoch already run, over all segments."""
        return sum(s.steps for s in self.segments)

    def to_json(self) -> dict:
        return {
            "epoch": self.epoch,
            "segments": [[s.ranks, s.batch, s.steps] for s in self.segments],
        }

    @classmethod
    def from_json(cls, value) -> EpochPosition:
        """The position a checkpoint header holds.

        Raises:
            ValueError: When ``value`` is not one.
        """
        try:
            epoch = int(value["epoch"])
            segments = tuple(Segment(*(int(x) for x in s)) for s in value["segments"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a data position: {value!r}") from exc
        if epoch < 0 or any(s.ranks < 1 or s.batch < 1 or s.steps < 0 for s in segments):
            raise ValueError(f"not a data position: {value!r}")
        return cls(epoch, segments)

    def to_ints(self) -> list[int]:
        """The position as integers (to broadcast it from rank 0)."""
        return [
            self.epoch,
            len(self.segments),
            *(x for s in self.segments for x in (s.ranks, s.batch, s.steps)),
        ]

    @classmethod
    def from_ints(cls, ints: Sequence[int]) -> EpochPosition:
        epoch, n = int(ints[0]), int(ints[1])
        flat = [int(x) for x in ints[2 : 2 + 3 * n]]
        return cls(epoch, tuple(Segment(*flat[3 * i : 3 * i + 3]) for i in range(n)))


@dataclass(frozen=True)
class Layout:
    """How one segment's rows are planned: ``ranks`` shards of the whole epoch (``rest`` None)
    or of the rows ``rest`` left; ``depth`` segments came before it (it seeds the plan)."""

    ranks: int
    rest: rr.Runs | None = None
    depth: int = 0


@dataclass(frozen=True)
class Resume:
    """Where this attempt's read starts, and how it records its position.

    Attributes:
        epoch: The epoch it starts in.
        layout: That epoch's plan for this attempt's ranks.
        skip_steps: Steps of ``layout`` already run (an attempt on the last segment's ranks and
            batch continues its plan).
        prefix: The segments before ``layout``'s.
        trained_before: Rows of ``epoch`` trained before this attempt, over all ranks.
        steps: Steps of ``epoch`` this attempt still runs (the same on every rank).
    """

    epoch: int
    layout: Layout
    skip_steps: int = 0
    prefix: tuple[Segment, ...] = ()
    trained_before: int = 0
    steps: int = 0
    batch: int = 0

    @property
    def moved(self) -> bool:
        """Whether the epoch continues on a new plan (other ranks or batch)."""
        return self.layout.rest is not None and self.skip_steps == 0

    def record(self, epoch: int, steps: int) -> EpochPosition:
        """The position after ``steps`` steps of ``epoch`` in this attempt."""
        if epoch != self.epoch:
            return EpochPosition(
                epoch, (Segment(self.layout.ranks, self.batch, steps),) if steps else ()
            )
        done = self.skip_steps + steps
        last = (Segment(self.layout.ranks, self.batch, done),) if done else ()
        return EpochPosition(epoch, self.prefix + last)


class EpochRows:
    """An epoch's plans and what their steps trained, as row ids (see the module docstring).

    Args:
        file_rows: Live rows per file of the split, in snapshot order.
        groups: ``fn(file) -> live rows of each of its row groups`` (the reader's counts).
        shuffle: Whether training shuffles (seeded piece order and shuffle pools).
        seed: The split's shuffle seed (``data.seed``).
        buffer: Rows per shuffle pool (0: not mixed).
    """

    def __init__(
        self,
        file_rows: Sequence[int],
        groups: Callable[[int], Sequence[int]],
        *,
        shuffle: bool,
        seed: int,
        buffer: int,
    ):
        self.file_rows = tuple(int(r) for r in file_rows)
        self.offsets = np.concatenate([[0], np.cumsum(self.file_rows, dtype=np.int64)])
        self.total = int(self.offsets[-1])
        self.groups = groups
        self.shuffle, self.seed = shuffle, seed
        self.buffer = buffer if shuffle else 0
        self._starts: dict[int, np.ndarray] = {}

    # -- plans -------------------------------------------------------------------------------
    def sizes(self, layout: Layout) -> list[int]:
        """Rows of each shard of ``layout``."""
        rows = self.total if layout.rest is None else rr.count(layout.rest)
        return shard_sizes(rows, layout.ranks)

    def steps(self, layout: Layout, batch: int) -> int:
        """Batches of ``batch`` rows the largest shard of ``layout`` needs (every rank runs it)."""
        return math.ceil(max(self.sizes(layout)) / batch)

    def pieces(self, epoch: int, layout: Layout, shard: int) -> list[Piece]:
        """Shard ``shard``'s row groups of ``epoch`` under ``layout``, in read order."""
        seed = self.seed + epoch if self.shuffle else None
        if layout.rest is None:
            plan = plan_epoch(self.file_rows, shard, layout.ranks, shuffle=self.shuffle, seed=seed)
            piece_seed = [rng_seed(seed), shard]
        else:
            sizes = self.sizes(layout)
            lo = sum(sizes[:shard])
            mine = rr.slice_by_rank(layout.rest, lo, lo + sizes[shard])
            plan = self._plan(mine, shard, layout.ranks)
            piece_seed = [rng_seed(seed), shard, layout.depth]
        return plan_pieces(plan, self.groups, shuffle=self.shuffle, seed=piece_seed)

    def pad_pieces(self, layout: Layout) -> list[Piece]:
        """One row to copy as padding, for a shard of ``layout`` that has no rows of its own."""
        source = layout.rest if layout.rest is not None else rr.runs([(0, self.total)])
        return plan_pieces(self._plan(rr.slice_by_rank(source, 0, 1), 0, 1), self.groups)

    def mix_seed(self, epoch: int, layout: Layout, shard: int) -> list[int]:
        """The seed of shard ``shard``'s shuffle pools in ``epoch`` under ``layout``."""
        return [self.seed, shard, epoch] + ([layout.depth] if layout.rest is not None else [])

    # -- what steps trained ------------------------------------------------------------------
    def piece_runs(self, piece: Piece) -> rr.Runs:
        """The row ids of ``piece``, ascending (the order its rows are read in)."""
        if piece.file not in self._starts:
            groups = np.asarray(self.groups(piece.file), dtype=np.int64)
            self._starts[piece.file] = np.concatenate([[0], np.cumsum(groups)])
        starts = self._starts[piece.file]
        base = int(self.offsets[piece.file] + starts[piece.row_group])
        keep = piece.keep or ((0, int(starts[piece.row_group + 1] - starts[piece.row_group])),)
        return rr.runs([(base + a, base + b) for a, b in keep])

    def consumed(self, epoch: int, layout: Layout, shard: int, rows: int) -> rr.Runs:
        """The row ids of the first ``rows`` rows shard ``shard`` read in ``epoch``."""
        if rows <= 0:
            return rr.EMPTY.copy()
        pieces = self.pieces(epoch, layout, shard)
        sizes = [p.rows for p in pieces]
        bounds = pool_bounds(sizes, self.buffer) if self.buffer > 0 else [len(pieces)]
        taken, done, start = [], 0, 0
        for index, end in enumerate(bounds):
            pool = pieces[start:end]
            pooled = sum(sizes[start:end])
            start = end
            if done + pooled <= rows:  # the whole pool was read
                taken.extend(self.piece_runs(p) for p in pool)
                done += pooled
                if done == rows:
                    break
                continue
            want = rows - done
            if self.buffer > 0:  # the pool's first rows after its permutation
                ids = np.concatenate([rr.to_ids(self.piece_runs(p)) for p in pool])
                taken.append(
                    rr.from_ids(
                        ids[pool_order(self.mix_seed(epoch, layout, shard), index, len(ids))[:want]]
                    )
                )
            else:  # not mixed: the pieces' first rows, in read order
                for p in pool:
                    runs = self.piece_runs(p)
                    n = min(rr.count(runs), want)
                    taken.append(rr.slice_by_rank(runs, 0, n))
                    want -= n
                    if want == 0:
                        break
            break
        return rr.union(*taken)

    def trained(self, epoch: int, segments: Sequence[Segment]) -> rr.Runs:
        """The row ids ``segments`` of ``epoch`` trained, over all their ranks."""
        trained, rest = rr.EMPTY.copy(), None
        for depth, seg in enumerate(segments):
            layout = Layout(seg.ranks, rest, depth)
            sizes = self.sizes(layout)
            parts = [
                self.consumed(epoch, layout, s, min(seg.steps * seg.batch, sizes[s]))
                for s in range(seg.ranks)
            ]
            trained = rr.union(trained, *parts)
            rest = rr.complement(trained, self.total)
        return trained

    def resume(self, position: EpochPosition, ranks: int, batch: int) -> Resume:
        """Where an attempt on ``ranks`` ranks of ``batch`` rows continues from ``position``."""
        epoch, segs = position.epoch, position.segments
        fresh = Resume(epoch, Layout(ranks), steps=self.steps(Layout(ranks), batch), batch=batch)
        if not segs:
            return fresh
        last = segs[-1]
        if (last.ranks, last.batch) == (ranks, batch):  # continue the last segment's plan
            prefix = segs[:-1]
            rest = rr.complement(self.trained(epoch, prefix), self.total) if prefix else None
            layout = Layout(ranks, rest, len(prefix))
            before = self.total - (self.total if rest is None else rr.count(rest))
            before += sum(min(last.steps * batch, n) for n in self.sizes(layout))
            steps = self.steps(layout, batch) - last.steps
            resumed = Resume(epoch, layout, last.steps, prefix, before, steps, batch)
        else:  # a new plan over the rows not trained yet
            trained = self.trained(epoch, segs)
            layout = Layout(ranks, rr.complement(trained, self.total), len(segs))
            before = rr.count(trained)
            steps = self.steps(layout, batch) if before < self.total else 0
            resumed = Resume(epoch, layout, 0, segs, before, steps, batch)
        if before >= self.total or resumed.steps <= 0:  # the epoch was done: start the next
            return Resume(epoch + 1, Layout(ranks), steps=fresh.steps, batch=batch)
        return resumed

    def _plan(self, ids: rr.Runs, shard: int, ranks: int) -> ShardPlan:
        files = tuple(rr.by_file(ids, self.offsets))
        return ShardPlan(shard=shard, num_shards=ranks, files=files, rows=rr.count(ids))


__all__ = ["EpochPosition", "EpochRows", "Layout", "Resume", "Segment"]
