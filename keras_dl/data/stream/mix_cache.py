"""The memory cache of a mixed training split (``data.cache=auto``): each source's decoded rows
kept after one read, so later reads of its draws are gathers from memory.

A mixed epoch reads each source's rows in draw order, scattered over its files and row groups,
so a source cannot be kept as it streams (as a single table's first epoch is). Instead, the
first time a source is read, its whole split is read once and kept per row group
(:class:`~keras_dl.data.stream.memory_cache.EpochCache`), if it fits what is left of
``data.cache_max_bytes`` after the sources kept before it; a source that does not fit streams
every epoch (its read stops where it went over the budget), the others are still served from
memory. A read of some pieces (row groups and masks of live rows, in draw order) is then those
rows' indices into the kept arrays, gathered a few blocks at a time: the same rows, in the same
order, as the read it replaces, so the mix's plan, its exactness and its resume are unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from keras_dl.data.stream.blocks import gather, rows_per_gather
from keras_dl.data.stream.memory_cache import EpochCache
from keras_dl.data.stream.shards import Piece

Read = Callable[[], Iterator[tuple[Piece, dict]]]  # a source's whole split: (piece, arrays)


class SourceCaches:
    """The sources' caches, sharing one memory budget (``max_bytes``; 0 turns them off).

    Args:
        max_bytes: The budget for all the sources together.
        sources: How many sources the mix has.
        block_rows: Rows per block of the stream (gathers are whole blocks).
    """

    def __init__(self, max_bytes: int, sources: int, block_rows: int):
        self.left = max_bytes
        self.block_rows = block_rows
        # Per source: None (not tried yet), an EpochCache holding it, or False (it streams).
        self.kept: list[EpochCache | bool | None] = [None] * sources

    def rows(self, source: int, pieces: Sequence[Piece], whole: Read) -> Iterator[dict] | None:
        """``source``'s rows of ``pieces`` from memory, or None when it streams; on its first
        call for ``source``, ``whole()`` is read to fill its cache (if it fits)."""
        cache = self._cache(source, whole)
        if cache is None:
            return None
        index = cache.order(pieces)  # in the pieces' order, not mixed
        return gather(cache.columns, index, rows_per_gather(cache.columns, self.block_rows))

    def cached(self) -> list[bool]:
        """Which sources are served from memory (those not tried yet: False)."""
        return [isinstance(c, EpochCache) for c in self.kept]

    def _cache(self, source: int, whole: Read) -> EpochCache | None:
        kept = self.kept[source]
        if kept is None:
            kept = False
            if self.left > 0:
                cache = EpochCache(self.left)
                with contextlib.closing(whole()) as read:
                    for _ in cache.fill(read):
                        if cache.disabled:  # over the budget: stop reading, it streams
                            break
                if cache.ready:
                    self.left -= cache.nbytes
                    kept = cache
            self.kept[source] = kept
        return kept if isinstance(kept, EpochCache) else None


__all__ = ["SourceCaches"]
