"""data/stream/mix_cache.SourceCaches: the sources share one budget, a source over what is
left streams, and its whole-split read stops where it went over."""

import numpy as np

from keras_dl.data.stream.mix_cache import SourceCaches
from keras_dl.data.stream.shards import Piece


def _whole(groups: int, rows: int, read: list):
    """A source's whole split: ``groups`` row groups of ``rows`` int64 ids each."""

    def chunks():
        for g in range(groups):
            read.append(g)
            yield Piece(0, g, None, rows), {"id": np.arange(g * rows, (g + 1) * rows)}

    return chunks


def _ids(chunks) -> list[int]:
    return [int(i) for c in chunks for i in c["id"]]


def test_sources_share_the_budget_and_each_is_read_once():
    caches = SourceCaches(max_bytes=3 * 4 * 8, sources=2, block_rows=2)  # 12 ids of 8 bytes
    read_a, read_b = [], []
    pieces = [Piece(0, 1, ((1, 3),), 2), Piece(0, 0, None, 4)]  # draw order, a mask first
    assert _ids(caches.rows(0, pieces, _whole(2, 4, read_a))) == [5, 6, 0, 1, 2, 3]
    assert _ids(caches.rows(0, pieces[:1], _whole(2, 4, read_a))) == [5, 6]
    assert read_a == [0, 1]  # filled by one read, then served from memory
    # 8 ids kept, 4 left: the second source's 8 do not fit, and its read stops at the excess.
    assert caches.rows(1, pieces, _whole(5, 4, read_b)) is None
    assert read_b == [0, 1]
    assert caches.cached() == [True, False]
    assert caches.rows(1, pieces, _whole(5, 4, read_b)) is None and read_b == [0, 1]


def test_no_budget_reads_nothing_ahead():
    caches, read = SourceCaches(0, 1, 8), []
    assert caches.rows(0, [Piece(0, 0, None, 4)], _whole(1, 4, read)) is None
    assert read == [] and caches.cached() == [False]
