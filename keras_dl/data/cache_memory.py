"""Keep a small split's decoded rows in memory after its first epoch (``data.cache=auto``).

A split that fits ``data.cache_max_bytes`` is read from the table once: the first epoch streams
from the reader and keeps each decoded chunk (one row group's ``{column: array}``, before the
row shuffle). Later epochs replay those chunks without a reader, a Parquet decode or reader
threads competing with the training step for the CPU.

What stays the same with the cache on:

- **Exactness.** The cache holds exactly one epoch of this shard, so every later epoch yields
  each row exactly once (the caller trims epochs to whole batches as before).
- **Reshuffling.** With shuffling, each cached epoch visits the chunks in a new seeded order and
  the caller's row shuffle (``shuffle_rows``) mixes rows across them, seeded per epoch.
- **Resume.** Epoch ``e``'s order depends only on the seed and ``e``: a cached epoch is the
  first epoch's chunk order permuted by ``rng(seed, e)``. A run resumed at ``e > 0`` in a new
  process first refills the cache with epoch 0's read (the same seeded read), then serves
  epoch ``e`` in the same order as the original run, so skipping the consumed steps lands on
  the same rows.

A split larger than the budget is noticed while filling: the partial cache is dropped and
every epoch streams, exactly as without the cache (again the same in a resumed run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np

log = logging.getLogger(__name__)


class EpochCache:
    """Epochs of one split's chunks: streamed by ``read`` until cached, then from memory.

    Args:
        max_bytes: Memory budget; a split whose decoded chunks exceed it is never cached.
            0 turns caching off.
        shuffle: Visit the cached chunks in a new order each epoch.
        seed: Seed of that order (with the epoch number). Defaults to 0.
    """

    def __init__(self, max_bytes: int, shuffle: bool, seed: int | None = 0):
        self.max_bytes = max_bytes
        self.shuffle = shuffle
        self.seed = 0 if seed is None else seed
        self.chunks: list[dict[str, np.ndarray]] | None = None
        self.disabled = max_bytes <= 0
        self.nbytes = 0

    def epoch(self, epoch: int, read: Callable[[int], Iterator[dict]]) -> Iterator[dict]:
        """Epoch ``epoch``'s chunks; ``read(e)`` streams epoch ``e`` from the table."""
        if self.disabled:
            yield from read(epoch)
            return
        if self.chunks is None:
            if epoch == 0 or not self.shuffle:  # this read is the one the cache keeps
                yield from self._fill(read(epoch), emit=True)
                return
            for _ in self._fill(read(0), emit=False):  # resumed past epoch 0: refill first
                pass
            if self.disabled:
                yield from read(epoch)
                return
        order = range(len(self.chunks))
        if self.shuffle and epoch > 0:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.chunks))
        for i in order:
            yield self.chunks[i]

    def _fill(self, chunks: Iterator[dict], emit: bool) -> Iterator[dict]:
        kept: list[dict] | None = []
        size = 0
        for chunk in chunks:
            if kept is not None:
                size += chunk_bytes(chunk)
                if size > self.max_bytes:
                    log.info(
                        "Split larger than data.cache_max_bytes (%d): streamed every epoch.",
                        self.max_bytes,
                    )
                    kept, self.disabled = None, True
                else:
                    kept.append(chunk)
            if emit:
                yield chunk
        if kept is not None:  # the whole epoch was read: only now is the cache complete
            self.chunks, self.nbytes = kept, size


def chunk_bytes(chunk: dict[str, np.ndarray]) -> int:
    """Memory held by one chunk, counting the bytes objects of binary columns."""
    total = 0
    for a in chunk.values():
        total += a.nbytes
        if a.dtype == object:
            total += sum(len(x) for x in a if x is not None)
    return total
