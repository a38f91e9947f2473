"""A mixed epoch's per-source plan (:mod:`.mix` step 1 and 2, and step 3's slot order): each
source's share of the epoch, the draws that fill it as passes over its live rows, and which
source each of the epoch's positions holds. Leaves of :mod:`.mix`: no I/O, no TF."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from keras_dl.data.stream import row_ranges as rr


def shares(
    rows: Sequence[int], weights: Sequence[float], epoch_rows: int | None = None
) -> list[int]:
    """Each source's rows in one epoch: ``epoch_rows * w / sum(w)``, by largest remainder.

    Args:
        rows: Live rows of each source (the default ``epoch_rows`` is their sum).
        weights: Each source's weight (>= 0, not all 0).
        epoch_rows: Rows per epoch. Defaults to ``sum(rows)``.

    Raises:
        ValueError: For a negative weight, all weights 0, or a source of weight > 0 without
            rows (callers name the source).
    """
    w = [Fraction(repr(float(x))) for x in weights]
    if len(w) != len(rows) or not w:
        raise ValueError(f"{len(rows)} source(s) but {len(w)} weight(s)")
    if any(x < 0 for x in w) or sum(w) == 0:
        raise ValueError(f"weights must be >= 0 and not all 0: {list(weights)}")
    for i, (n, x) in enumerate(zip(rows, w)):
        if x > 0 and n <= 0:
            raise ValueError(f"source {i} has weight {float(x)} but no live rows")
    total = sum(int(n) for n in rows) if epoch_rows is None else int(epoch_rows)
    if total < 0:
        raise ValueError(f"epoch_rows must be >= 0: {total}")
    quotas = [total * x / sum(w) for x in w]
    out = [math.floor(q) for q in quotas]
    left = total - sum(out)
    # Largest fractional part first; equal parts: the earlier source first.
    order = sorted(range(len(w)), key=lambda i: (-(quotas[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return out


class SourceDraws:
    """One source's draws of one epoch: draw ``d`` as a row id, passes of every live row.

    Args:
        file_rows: The source's live rows per file, in snapshot order.
        share: Its rows this epoch.
        shuffle: Visit files in a seeded order, rotated by a seeded offset, anew each pass.
        seed: The pass seeds' prefix (``[data.seed, epoch, source]``).
    """

    def __init__(self, file_rows: Sequence[int], share: int, *, shuffle: bool, seed: Sequence[int]):
        counts = np.asarray(file_rows, dtype=np.int64)
        self.rows = int(counts.sum())
        self.share = int(share)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        lo, hi = [], []
        passes = -(-self.share // self.rows) if self.rows else 0
        for p in range(passes):
            a, b = _pass_runs(counts, offsets, shuffle, [*seed, p])
            lo.append(a)
            hi.append(b)
        lo_all = np.concatenate(lo) if lo else np.zeros(0, np.int64)
        hi_all = np.concatenate(hi) if hi else np.zeros(0, np.int64)
        lengths = hi_all - lo_all
        starts = np.concatenate([[0], np.cumsum(lengths)])
        keep = starts[:-1] < self.share  # the last pass is cut at the share
        self._lo, self._hi = lo_all[keep], hi_all[keep]
        self._start = starts[: len(self._lo) + 1].copy()
        if len(self._lo):
            self._hi[-1] -= self._start[-1] - self.share
            self._start[-1] = self.share

    def runs(self, first: int, stop: int) -> list[tuple[int, int]]:
        """Row-id runs of draws ``first`` to ``stop`` (exclusive), in draw order."""
        if stop <= first:
            return []
        a = int(np.searchsorted(self._start, first, side="right")) - 1
        b = int(np.searchsorted(self._start, stop, side="left"))
        out = []
        for k in range(a, b):
            s = int(self._start[k])
            lo = int(self._lo[k]) + max(first - s, 0)
            hi = int(self._lo[k]) + min(stop - s, int(self._hi[k] - self._lo[k]))
            if hi > lo:
                out.append((lo, hi))
        return out

    def ids(self, draws: rr.Runs) -> np.ndarray:
        """Row ids of the draws ``draws`` (a set of draw indices), in draw order."""
        # A run of draws maps to row-id runs in draw order; keep that order (not sorted).
        parts = [
            np.concatenate([np.arange(lo, hi) for lo, hi in self.runs(int(a), int(b))])
            for a, b in draws.tolist()
            if b > a
        ]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def slot_sources(counts: Sequence[int], shuffle: bool, seed: Sequence[int]) -> np.ndarray:
    """The source of each of ``sum(counts)`` positions: a seeded permutation of ``counts[s]``
    copies of ``s`` (without shuffling: spread evenly, source ``s``'s ``k``-th copy near
    ``(k + 1/2) / counts[s]`` of the way)."""
    counts = [int(c) for c in counts]
    labels = np.repeat(np.arange(len(counts), dtype=np.int16), counts)
    if shuffle:
        return np.random.default_rng([*map(int, seed)]).permutation(labels)
    where = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c] or [np.zeros(0)])
    return labels[np.argsort(where, kind="stable")]


def _pass_runs(counts: np.ndarray, offsets: np.ndarray, shuffle: bool, seed) -> tuple:
    """One pass over a source's rows as row-id runs ``(lo, hi)`` in visiting order: files in
    a seeded order, rotated by a seeded row offset (snapshot order, no offset, unshuffled)."""
    order = np.arange(len(counts))
    offset = 0
    total = int(counts.sum())
    if shuffle:
        rng = np.random.default_rng([*map(int, seed)])
        order = rng.permutation(len(counts))
        offset = int(rng.integers(total)) if total else 0
    order = order[counts[order] > 0]
    lo, hi = offsets[order], offsets[order] + counts[order]
    if offset:  # rotate: start ``offset`` rows in, wrap to the start
        ends = np.cumsum(hi - lo)
        k = int(np.searchsorted(ends, offset, side="right"))
        cut = int(lo[k] + offset - (ends[k - 1] if k else 0))
        lo = np.concatenate([[cut], lo[k + 1 :], lo[:k], [lo[k]]])
        hi = np.concatenate([[hi[k]], hi[k + 1 :], hi[:k], [cut]])
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
    return lo.astype(np.int64), hi.astype(np.int64)


def ordinals(labels: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions hold the same label."""
    out = np.zeros(len(labels), dtype=np.int64)
    for s in np.unique(labels):
        where = labels == s
        out[where] = np.arange(int(where.sum()))
    return out


__all__ = ["SourceDraws", "ordinals", "shares", "slot_sources"]
