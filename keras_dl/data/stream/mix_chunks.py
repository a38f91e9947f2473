"""A mixed epoch's chunks put together from its sources' reads (:mod:`keras_dl.data.stream.mix_stream`):
each source's rows taken in draw order across its read's arrays, and placed where the plan puts
them, the shuffle pool's permutation applied in the same write."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from keras_dl.data.stream.blocks import num_rows
from keras_dl.errors import DataError


class Rows:
    """Rows of one source's read, taken ``n`` at a time across its chunks."""

    def __init__(self, chunks: Iterator[dict]):
        self.chunks, self.held, self.at = chunks, None, 0

    def take(self, n: int) -> dict:
        parts = []
        while n > 0:
            if self.held is None or self.at >= num_rows(self.held):
                try:
                    self.held, self.at = next(self.chunks), 0
                except StopIteration:
                    raise DataError(
                        "A mixed epoch's source ended before its planned rows: its table "
                        "changed while it was read. Retry; if it persists, report it."
                    ) from None
            k = min(n, num_rows(self.held) - self.at)
            parts.append({c: v[self.at : self.at + k] for c, v in self.held.items()})
            self.at += k
            n -= k
        if len(parts) == 1:
            return parts[0]
        return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


def unique_runs(pieces: list) -> Iterator[list]:
    """``pieces`` cut where a row group comes again (a rotated pass's two ends, or the next
    pass): one reader keys its masks by row group, so each read holds a row group once."""
    part, seen = [], set()
    for p in pieces:
        key = (p.file, p.row_group)
        if key in seen:
            yield part
            part, seen = [], set()
        part.append(p)
        seen.add(key)
    if part:
        yield part


def place(labels: np.ndarray, parts: dict[int, dict], order: np.ndarray | None = None) -> dict:
    """One chunk whose row ``i`` is the next row of source ``labels[i]``; with ``order``, that
    chunk permuted (row ``i`` is its row ``order[i]``).

    Each source's part is written once, straight to where its rows end up (an integer
    scatter per source and column: no intermediate chunk to permute after).
    """
    if len(parts) == 1:
        only = next(iter(parts.values()))
        return only if order is None else {c: v[order] for c, v in only.items()}
    if order is not None:
        at = np.empty(len(labels), dtype=np.intp)
        at[order] = np.arange(len(labels), dtype=np.intp)  # where each chunk row ends up
    first = next(iter(parts.values()))
    out = {c: np.empty((len(labels), *v.shape[1:]), dtype=v.dtype) for c, v in first.items()}
    for s, arrays in parts.items():
        where = np.flatnonzero(labels == s)
        if order is not None:
            where = at[where]
        for c, v in arrays.items():
            out[c][where] = v
    return out


__all__ = ["Rows", "place", "unique_runs"]
