"""Keep a small split's decoded rows in memory after its first read (``data.cache=auto``).

A split whose decoded rows fit ``data.cache_max_bytes`` is read from the table once, and kept
per row group: ``(file, row group) -> its live rows``, one array per column for the whole split.
Every later epoch, whichever rows the shard planner gives this rank (they change every epoch
with shuffling), is then a list of row indices into those arrays (:meth:`EpochCache.order`),
gathered a few batches at a time: no reader, Parquet decode or reader threads competing with the
training step for the CPU. When the split's preprocess hook is deterministic (decoding images
without augmentation) and its output fits, the cache holds the hook's output, so images are
decoded once.

What stays the same with the cache on:

- **Exactness.** An epoch served from memory is the same pieces (row groups and masks) as the
  read it replaces, so every row is still trained once per epoch, on exactly one rank.
- **Order.** :meth:`order` mixes rows exactly as :func:`keras_dl.data.stream.shuffle.shuffle_rows` mixes
  the streamed pieces (the same pools, the same seeded permutations): an epoch has the same rows
  in the same order whether it was streamed or served from memory, so a resumed run lands on the
  same rows either way.

With one shard, the first epoch reads every row group whole and fills the cache as it streams.
With several shards a rank reads only its rows, so the cache is filled by one read of the whole
split (at the first epoch served from memory), which stops at the row group that goes over
the budget. A split larger than the budget is noticed while filling: the partial cache is
dropped and every epoch streams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np

from keras_dl.data.stream.shards import Piece
from keras_dl.data.stream.shuffle import pool_bounds, pool_order

log = logging.getLogger(__name__)


class EpochCache:
    """A split's row groups in memory: ``(file, row group) -> rows`` of one array per column.

    Args:
        max_bytes: Memory budget; a split whose decoded rows exceed it is never cached.
            0 turns caching off.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.disabled = max_bytes <= 0
        self.columns: dict[str, np.ndarray] | None = None  # the split, one array per column
        self.where: dict[tuple[int, int], tuple[int, int]] = {}  # piece -> (start, rows)
        self.nbytes = 0

    @property
    def ready(self) -> bool:
        """Whether the whole split is in memory."""
        return not self.disabled and self.columns is not None

    def fill(
        self, chunks: Iterator[tuple[Piece, dict]], emit: bool = True
    ) -> Iterator[tuple[Piece, dict]]:
        """Pass ``chunks`` on (when ``emit``) and keep them, if they are every row group whole
        and fit the budget; the cache is complete only once the last chunk went by. Not
        emitting, it stops reading ``chunks`` (and closes them) at the first chunk that cannot
        be kept: nothing is passed on, and the rest would be read for nothing."""
        kept: list | None = []
        size = 0
        for piece, chunk in chunks:
            if kept is not None:
                size += chunk_bytes(chunk)
                if piece.keep is not None or size > self.max_bytes:
                    if size > self.max_bytes:
                        log.info(
                            "Split larger than data.cache_max_bytes (%d): streamed every epoch.",
                            self.max_bytes,
                        )
                        self.disabled = True
                    kept = None
                else:
                    kept.append((piece, chunk))
            if emit:
                yield piece, chunk
            elif kept is None:
                getattr(chunks, "close", lambda: None)()  # the reader's threads stop
                return
        if kept is not None and not self.disabled:
            self._keep(kept)
            self.nbytes = size

    def order(self, pieces: Sequence[Piece], buffer_rows: int = 0, seed=None) -> np.ndarray:
        """Row indices into :attr:`columns` of an epoch of ``pieces``, in the order it is read.

        The same order as the pieces streamed and mixed by ``shuffle_rows`` (``buffer_rows``
        0: not mixed).
        """
        parts = [self._rows(p) for p in pieces]
        if buffer_rows <= 0:
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        out, start = [], 0
        for index, end in enumerate(pool_bounds([len(p) for p in parts], buffer_rows)):
            merged = np.concatenate(parts[start:end])
            out.append(merged[pool_order(seed, index, len(merged))])
            start = end
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _rows(self, piece: Piece) -> np.ndarray:
        start, count = self.where[(piece.file, piece.row_group)]
        if piece.keep is None:
            return np.arange(start, start + count, dtype=np.int64)
        return np.concatenate(
            [np.arange(start + lo, start + hi, dtype=np.int64) for lo, hi in piece.keep]
        )

    def _keep(self, kept: list) -> None:
        """Hold the split as one array per column, and where each row group starts in it."""
        start = 0
        for piece, chunk in kept:
            count = len(next(iter(chunk.values()))) if chunk else 0
            self.where[(piece.file, piece.row_group)] = (start, count)
            start += count
        names = list(kept[0][1]) if kept else []
        self.columns = {k: np.concatenate([c[k] for _, c in kept]) for k in names}


def chunk_bytes(chunk: dict[str, np.ndarray]) -> int:
    """Memory held by one chunk, counting the bytes objects of binary columns."""
    total = 0
    for a in chunk.values():
        total += a.nbytes
        if a.dtype == object:
            total += sum(len(x) for x in a if x is not None)
    return total
