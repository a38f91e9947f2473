"""The in-memory level of shuffling: rows mixed across consecutive row groups.

Beneath it, the row groups are read in a seeded order (:mod:`keras_dl.data.stream.shards`); the memory
cache replays the same mixing on row indices (:meth:`~keras_dl.data.stream.memory_cache.EpochCache.order`),
and a resume on another number of ranks replays it on row ids (:mod:`keras_dl.data.stream.epoch_position`).

Rows are mixed in *pools*: consecutive chunks are pooled until they hold ``buffer_rows`` rows,
then permuted. Each pool's permutation has its own seed (the stream's seed and the pool's index),
so where an epoch stopped can be found by permuting one pool, not every pool before it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from keras_dl.data.stream.blocks import num_rows


def shuffle_rows(
    batches: Iterator[dict[str, np.ndarray]], buffer_rows: int, seed: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Mix rows across consecutive row groups, vectorized: fill ~``buffer_rows``, permute, emit.

    Every row that goes in comes out exactly once.
    """
    pool: list[dict[str, np.ndarray]] = []
    pooled = index = 0
    for batch in batches:
        pool.append(batch)
        pooled += num_rows(batch)
        if pooled >= buffer_rows:
            yield _permute(pool, pool_order(seed, index, pooled))
            pool, pooled, index = [], 0, index + 1
    if pool:
        yield _permute(pool, pool_order(seed, index, pooled))


def pool_order(seed, index: int, rows: int) -> np.ndarray:
    """The permutation of pool ``index`` (of ``rows`` rows) of the stream seeded ``seed``."""
    parts = [] if seed is None else list(np.atleast_1d(seed))
    return np.random.default_rng([*map(int, parts), index]).permutation(rows)


def pool_bounds(sizes: Sequence[int], buffer_rows: int) -> list[int]:
    """Where each pool ends, as a count of the chunks of ``sizes`` it has taken in."""
    ends, pooled = [], 0
    for i, n in enumerate(sizes):
        pooled += n
        if pooled >= buffer_rows:
            ends.append(i + 1)
            pooled = 0
    if not ends or ends[-1] != len(sizes):
        ends.append(len(sizes))
    return ends if sizes else []


def _permute(pool: Sequence[dict[str, np.ndarray]], order: np.ndarray) -> dict:
    # A row group larger than the buffer is permuted as it is: no concatenation copy.
    merged = (
        pool[0] if len(pool) == 1 else {k: np.concatenate([b[k] for b in pool]) for k in pool[0]}
    )
    return {k: np.take(v, order, axis=0) for k, v in merged.items()}
