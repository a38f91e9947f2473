"""The in-memory level of shuffling: rows mixed across consecutive row groups.

Beneath it, the row groups are read in a seeded order (:mod:`keras_dl.data.shards`); the memory
cache replays the same mixing on row indices (:meth:`~keras_dl.data.cache_memory.EpochCache.order`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from keras_dl.data.blocks import num_rows


def shuffle_rows(
    batches: Iterator[dict[str, np.ndarray]], buffer_rows: int, seed: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Mix rows across consecutive row groups, vectorized: fill ~``buffer_rows``, permute, emit.

    Every row that goes in comes out exactly once.
    """
    rng = np.random.default_rng(seed)
    pool: list[dict[str, np.ndarray]] = []
    pooled = 0
    for batch in batches:
        pool.append(batch)
        pooled += num_rows(batch)
        if pooled >= buffer_rows:
            yield _permute(pool, rng)
            pool, pooled = [], 0
    if pool:
        yield _permute(pool, rng)


def _permute(pool: Sequence[dict[str, np.ndarray]], rng: np.random.Generator) -> dict:
    # A row group larger than the buffer is permuted as it is: no concatenation copy.
    merged = (
        pool[0] if len(pool) == 1 else {k: np.concatenate([b[k] for b in pool]) for k in pool[0]}
    )
    order = rng.permutation(num_rows(merged))
    return {k: np.take(v, order, axis=0) for k, v in merged.items()}
