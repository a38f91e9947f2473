"""Row-exact shards: which live rows each rank reads in each epoch (no I/O here).

A split's live rows are numbered in *epoch order*: its files in a seeded order (the snapshot's
order without shuffling), each file's live rows in file order. Shard ``s`` of ``S`` takes one
contiguous run of that numbering, ``N // S`` rows or one more, so together the shards read every
live row exactly once and their sizes differ by at most one, whatever the number of files and
row groups (one row group and eight ranks works). With shuffling, the numbering is also rotated
by a seeded offset, so which rows go to which rank changes every epoch, even for a table of one
file; the same seed and epoch give the same plan on every rank and in a resumed run.

Planning needs only each file's live-row count: from the Delta log (``numRecords`` less each
deletion vector's cardinality) it opens no footer at all. A rank then opens the footers of the
files it reads, cuts its runs into row-group :class:`Piece` objects, and reads only the row
groups that hold its rows, masking the rest of a boundary row group as a deletion vector would.

Contiguous runs keep reads local: a rank reads about ``1/S`` of the bytes (plus at most two
boundary row groups), unlike a per-row assignment, which would make every rank read everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ShardPlan:
    """One shard's rows of one epoch: per file, the runs of its live rows, in read order.

    Attributes:
        shard: This shard.
        num_shards: The number of shards.
        files: ``(file index, ((lo, hi), ...))`` in read order; ``lo``/``hi`` number the file's
            live rows (deleted and filtered-out rows do not count), ``hi`` exclusive.
        rows: The rows this shard reads (the sum of the runs).
    """

    shard: int
    num_shards: int
    files: tuple[tuple[int, Ranges], ...]
    rows: int


@dataclass(frozen=True)
class Piece:
    """One row group of a shard's epoch, and which of its live rows the shard keeps.

    Attributes:
        file: The file's index in the snapshot.
        row_group: The row group within the file.
        keep: Runs of the row group's live rows to keep (``(lo, hi)``, numbered within the row
            group), or None to keep them all.
        rows: The rows kept.
    """

    file: int
    row_group: int
    keep: Ranges | None
    rows: int


def shard_sizes(total: int, num_shards: int) -> list[int]:
    """Rows of each shard: ``total // num_shards``, the first ``total % num_shards`` one more."""
    base, extra = divmod(total, num_shards)
    return [base + (s < extra) for s in range(num_shards)]


def plan_epoch(
    file_rows: Sequence[int],
    shard: int = 0,
    num_shards: int = 1,
    *,
    shuffle: bool = False,
    seed: int | None = None,
) -> ShardPlan:
    """Shard ``shard``'s rows of one epoch, from each file's live-row count alone.

    Args:
        file_rows: Live rows of each file of the snapshot, in snapshot order.
        shard: This shard. Defaults to 0.
        num_shards: The number of shards. Defaults to 1.
        shuffle: Visit files in a seeded order and rotate the shards' runs by a seeded offset.
            Defaults to False (snapshot order, shard 0 first).
        seed: The epoch's seed (the same on every shard). Defaults to None.

    Raises:
        ValueError: When there are fewer live rows than shards (callers say how to fix it).
    """
    counts = np.asarray(file_rows, dtype=np.int64)
    total = int(counts.sum())
    if total < num_shards:
        raise ValueError(f"{total} live row(s) cannot fill {num_shards} shards")
    order = np.arange(len(counts))
    offset = 0
    if shuffle:
        rng = np.random.default_rng(rng_seed(seed))
        order = rng.permutation(len(counts))
        if num_shards > 1:
            offset = int(rng.integers(total))
    sizes = shard_sizes(total, num_shards)
    start = (sum(sizes[:shard]) + offset) % total
    size = sizes[shard]
    runs = [(start, min(start + size, total))]
    if start + size > total:  # the run wraps past the last row to the first
        runs.append((0, start + size - total))
    ordered = counts[order]
    ends = np.cumsum(ordered)
    starts = ends - ordered
    by_file: dict[int, list[tuple[int, int]]] = {}
    for lo, hi in runs:
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(starts, hi, side="left"))
        for k in range(first, last):
            a, b = max(lo, int(starts[k])), min(hi, int(ends[k]))
            if b > a:
                base = int(starts[k])
                by_file.setdefault(int(order[k]), []).append((a - base, b - base))
    files = tuple((f, _merge(r)) for f, r in by_file.items())
    return ShardPlan(shard=shard, num_shards=num_shards, files=files, rows=size)


def plan_pieces(
    plan: ShardPlan,
    group_rows: Callable[[int], Sequence[int]],
    *,
    shuffle: bool = False,
    seed: int | None = None,
) -> list[Piece]:
    """Cut a plan into row groups: only those holding the shard's rows, masks at the edges.

    Args:
        plan: The shard's plan.
        group_rows: ``fn(file index) -> live rows of each of its row groups`` (from the file's
            footer and deletion vector, or a scan); called only for the plan's files.
        shuffle: Read the pieces in a seeded order (rows are mixed further by the shuffle
            buffer). Defaults to False.
        seed: Seed of that order. Defaults to None.
    """
    pieces = []
    for file, runs in plan.files:
        groups = np.asarray(group_rows(file), dtype=np.int64)
        ends = np.cumsum(groups)
        starts = ends - groups
        for rg in range(len(groups)):
            g0, g1 = int(starts[rg]), int(ends[rg])
            keep = tuple(
                (max(lo, g0) - g0, min(hi, g1) - g0) for lo, hi in runs if lo < g1 and hi > g0
            )
            rows = sum(b - a for a, b in keep)
            if rows == 0:
                continue
            whole = keep == ((0, g1 - g0),)
            pieces.append(Piece(file, rg, None if whole else keep, rows))
    if shuffle and len(pieces) > 1:
        order = np.random.default_rng(rng_seed(seed)).permutation(len(pieces))
        pieces = [pieces[i] for i in order]
    return pieces


def keep_mask(keep: Ranges, rows: int) -> np.ndarray:
    """A boolean mask of ``rows`` rows that is True inside the runs ``keep``."""
    mask = np.zeros(rows, dtype=bool)
    for lo, hi in keep:
        mask[lo:hi] = True
    return mask


def _merge(runs: list[tuple[int, int]]) -> Ranges:
    """Sorted, non-overlapping runs (a wrapped run may meet its other half in one file)."""
    out: list[list[int]] = []
    for lo, hi in sorted(runs):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def rng_seed(seed):
    """The seed numpy's generator is given for ``seed`` (None: 0, so plans stay seeded)."""
    return 0 if seed is None else seed
