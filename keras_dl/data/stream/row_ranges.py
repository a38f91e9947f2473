"""Sets of a split's rows as sorted runs of row ids (no I/O here).

A split's *row ids* number its live rows in snapshot order: file ``f``'s live row ``i`` (deleted
and filtered-out rows do not count) is ``offsets[f] + i``, where ``offsets`` is the running sum of
each file's live rows. The numbering depends on the table version and the split alone, not on the
number of ranks or the epoch, so a set of row ids means the same rows to any rank count.

A set is an ``(n, 2)`` int64 array of runs ``[lo, hi)``, sorted and disjoint, so a set made of
whole row groups costs 16 bytes a row group, whatever their rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Runs = np.ndarray  # (n, 2) int64: [lo, hi) per run, sorted, disjoint, none empty

EMPTY = np.zeros((0, 2), dtype=np.int64)


def runs(pairs: Sequence[tuple[int, int]] | np.ndarray) -> Runs:
    """``pairs`` (any order, may touch or overlap, may be empty) as a set."""
    a = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    a = a[a[:, 1] > a[:, 0]]
    if len(a) <= 1:
        return a.copy()
    a = a[np.argsort(a[:, 0], kind="stable")]
    # A run starts a new group unless it begins at or before the furthest end so far.
    ends = np.maximum.accumulate(a[:, 1])
    new = np.empty(len(a), dtype=bool)
    new[0] = True
    new[1:] = a[1:, 0] > ends[:-1]
    group = np.cumsum(new) - 1
    lo = a[new, 0]
    hi = np.zeros(len(lo), dtype=np.int64)
    np.maximum.at(hi, group, a[:, 1])
    return np.stack([lo, hi], axis=1)


def from_ids(ids: np.ndarray) -> Runs:
    """Row ids (any order, no repeats) as a set."""
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    if len(ids) == 0:
        return EMPTY.copy()
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], cut])
    stops = np.concatenate([cut, [len(ids)]])
    return np.stack([ids[starts], ids[stops - 1] + 1], axis=1)


def to_ids(s: Runs) -> np.ndarray:
    """Every row id of ``s``, ascending (for sets small enough to list)."""
    if len(s) == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = s[:, 1] - s[:, 0]
    starts = np.repeat(s[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(int(lengths.sum()), dtype=np.int64)


def count(s: Runs) -> int:
    return int((s[:, 1] - s[:, 0]).sum()) if len(s) else 0


def union(*sets: Runs) -> Runs:
    parts = [x for x in sets if len(x)]
    return runs(np.concatenate(parts)) if parts else EMPTY.copy()


def complement(s: Runs, total: int) -> Runs:
    """The row ids in ``[0, total)`` that ``s`` does not hold."""
    if len(s) == 0:
        return runs([(0, total)])
    lo = np.concatenate([[0], s[:, 1]])
    hi = np.concatenate([s[:, 0], [total]])
    return runs(np.stack([lo, hi], axis=1))


def slice_by_rank(s: Runs, start: int, stop: int) -> Runs:
    """The ``start``-th to ``stop``-th row ids of ``s`` (counting from 0, ``stop`` exclusive)."""
    if stop <= start or len(s) == 0:
        return EMPTY.copy()
    lengths = s[:, 1] - s[:, 0]
    before = np.concatenate([[0], np.cumsum(lengths)])  # rows before each run
    first = int(np.searchsorted(before, start, side="right")) - 1
    last = int(np.searchsorted(before, stop, side="left"))  # exclusive
    out = s[first:last].copy()
    out[0, 0] += start - before[first]
    out[-1, 1] -= before[last] - stop
    return out[out[:, 1] > out[:, 0]]


def by_file(s: Runs, offsets: np.ndarray) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    """``s`` cut at file boundaries: ``(file, ((lo, hi), ...))`` numbered within each file,
    files ascending. ``offsets``: each file's first row id, and the total last."""
    out: dict[int, list[tuple[int, int]]] = {}
    for lo, hi in s.tolist():
        f = int(np.searchsorted(offsets, lo, side="right")) - 1
        while lo < hi:
            end = min(hi, int(offsets[f + 1]))
            if end > lo:
                out.setdefault(f, []).append((lo - int(offsets[f]), end - int(offsets[f])))
            lo, f = end, f + 1
    return [(f, tuple(r)) for f, r in sorted(out.items())]


def to_bytes(s: Runs) -> int:
    """The set's size as stored (16 bytes a run)."""
    return int(s.nbytes)
