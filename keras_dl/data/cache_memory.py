"""Keep a small split's decoded rows in memory after its first epoch (``data.cache=auto``).

A split that fits ``data.cache_max_bytes`` is read from the table once: the first epoch streams
from the reader and keeps each decoded chunk (one row group's ``{column: array}``, before the
row shuffle). Later epochs replay those chunks without a reader, a Parquet decode or reader
threads competing with the training step for the CPU: the completed epoch is held as one array
per column, and a later epoch is a permutation of row indices (:meth:`EpochCache.order`),
gathered a few batches at a time. When the split's preprocess hook is deterministic (decoding
images without augmentation) and its output fits, the chunks are the hook's output, so the
images are decoded once, not every epoch.

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
        self.columns: dict[str, np.ndarray] | None = None  # the cached epoch, one array each
        self.bounds: np.ndarray | None = None  # where each chunk starts in ``columns``
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

    def ready(self, epoch: int, read: Callable[[int], Iterator[dict]]) -> bool:
        """Whether epoch ``epoch`` is served from memory (by :meth:`order` and :attr:`columns`).

        False when it streams (the cache is off, over budget, or this is the read that fills
        it: use :meth:`epoch`). A run resumed past epoch 0 refills from epoch 0's read first.
        """
        if self.disabled:
            return False
        if self.chunks is None:
            if epoch == 0 or not self.shuffle:
                return False
            for _ in self._fill(read(0), emit=False):
                pass
        return not self.disabled

    def order(self, epoch: int, buffer_rows: int = 0, seed=None) -> np.ndarray:
        """Row indices into :attr:`columns` of cached epoch ``epoch``, in the order it is read.

        The same order as :meth:`epoch`'s chunks mixed by ``keras_dl.data.reader.shuffle_rows``
        (``buffer_rows`` 0: not mixed), as indices: the epoch is then gathered a few batches at a
        time, one copy, instead of a pool of chunks concatenated and permuted (two copies, and a
        wait for the whole pool before its first batch).
        """
        chunks = range(len(self.chunks))
        if self.shuffle and epoch > 0:
            chunks = np.random.default_rng([self.seed, epoch]).permutation(len(self.chunks))
        parts = [np.arange(self.bounds[i], self.bounds[i + 1]) for i in chunks]
        if buffer_rows <= 0:
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        rng = np.random.default_rng(seed)
        out, pool, pooled = [], [], 0
        for part in parts:
            pool.append(part)
            pooled += len(part)
            if pooled >= buffer_rows:
                out.append(_permuted(pool, rng))
                pool, pooled = [], 0
        if pool:
            out.append(_permuted(pool, rng))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

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
            self._keep(kept)
            self.nbytes = size

    def _keep(self, kept: list[dict]) -> None:
        """Hold the epoch as one array per column (:attr:`columns`); chunks become views."""
        sizes = [len(next(iter(c.values()))) if c else 0 for c in kept]
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        names = list(kept[0]) if kept else []
        self.columns = {k: np.concatenate([c[k] for c in kept]) for k in names}
        self.chunks = [
            {k: v[self.bounds[i] : self.bounds[i + 1]] for k, v in self.columns.items()}
            for i in range(len(kept))
        ]


def chunk_bytes(chunk: dict[str, np.ndarray]) -> int:
    """Memory held by one chunk, counting the bytes objects of binary columns."""
    total = 0
    for a in chunk.values():
        total += a.nbytes
        if a.dtype == object:
            total += sum(len(x) for x in a if x is not None)
    return total


def _permuted(pool: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    merged = pool[0] if len(pool) == 1 else np.concatenate(pool)
    return merged[rng.permutation(len(merged))]
