"""A Hypothesis property of mixed training splits over real tables, read through the real
readers: a generated table (files, row groups and deletion vectors drawn by Hypothesis) mixed
with a table deltalake wrote in two versions, of which only the rows added after version 0
count (``since_version=0``), by any weights and epoch size, on 1 to 4 ranks, any batch. In
each of two epochs every source gives exactly its planned share of live rows, as whole passes
then a remainder, over the ranks together; no deleted row and no row of version 0 is trained."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.config import DataConfig, SourceConfig
from keras_dl.data import make_splits
from tests.data.stream.test_weights import SETTINGS, label_of, layouts, weight_of, write_weighted

OLD, NEW = range(5000, 5010), range(6000, 6013)  # the grown table's versions 0 and 1
_tables = itertools.count()


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> str:
    from deltalake import write_deltalake

    path = str(tmp_path_factory.mktemp("mixed_property") / "grown")
    for ids in (OLD, NEW):
        values = np.asarray(ids, dtype=np.int64)
        table = pa.table({"id": values, "label": label_of(values), "w": weight_of(values)})
        write_deltalake(path, table, mode="append")
    return path


def _batches(split, epochs: int):
    """``(epoch, ids, live)`` of each batch of ``epochs`` epochs, from one pass over the split's
    dataset: the batch's ids in order, padding included, and which of them are live rows."""
    for i, batch in enumerate(split.dataset.take(epochs * split.steps)):
        features = batch[0]  # one feature: its tensor, not a dict
        got = np.asarray(features["id"] if isinstance(features, dict) else features).reshape(-1)
        keep = np.asarray(batch[-1]) > 0 if split.weighted else np.ones(len(got), bool)
        yield i // split.steps, got, keep


def _epochs(split, epochs: int) -> list[Counter]:
    """Each epoch's live ids."""
    out = [Counter() for _ in range(epochs)]
    for epoch, got, keep in _batches(split, epochs):
        out[epoch].update(got[keep].tolist())
    return out


# The sources' weights and the epoch's size, as both properties draw them.
WEIGHTS = st.tuples(st.sampled_from([0.2, 1.0, 3.0]), st.sampled_from([0.2, 1.0, 3.0]))
EPOCH_ROWS = st.one_of(st.none(), st.integers(4, 40))


@pytest.mark.slow
@settings(max_examples=25, **SETTINGS)
@given(
    layout=layouts(),
    weights=WEIGHTS,
    epoch_rows=EPOCH_ROWS,
    ranks=st.integers(1, 4),
    batch=st.integers(1, 5),
)
def test_every_epoch_is_each_sources_live_share_without_deleted_or_old_rows(
    grown, tmp_path, layout, weights, epoch_rows, ranks, batch
):
    files, deleted = layout
    drawn, live = write_weighted(tmp_path / f"t{next(_tables)}", files, deleted)
    data = DataConfig(
        sources=(
            SourceConfig("drawn", drawn, weights[0]),
            SourceConfig("grown", grown, weights[1], since_version=0),
        ),
        features=("id",),
        epoch_rows=epoch_rows,
        shuffle_buffer=8,
    )
    epochs, shares = [Counter(), Counter()], None
    for rank in range(ranks):
        split = make_splits(data, batch, rank=rank, world_size=ranks).train
        shares = split.stream.mix.shares
        for e, got in enumerate(_epochs(split, 2)):
            epochs[e].update(got)
    sources = (set(live), set(NEW))
    if epoch_rows is None:
        assert sum(shares) == len(live) + len(NEW)  # every source's live rows together
    for got in epochs:
        # Nothing but live rows of the versions read: no deleted row, no row of version 0.
        assert set(got) <= sources[0] | sources[1], sorted(set(got) - sources[0] - sources[1])
        for rows, share in zip(sources, shares):
            # Its share exactly, as whole passes then a remainder: each row k or k+1 times.
            assert sum(got[i] for i in rows) == share
            passes, rest = divmod(share, len(rows))
            times = sorted(got[i] for i in rows)
            assert times == [passes] * (len(rows) - rest) + [passes + 1] * rest, got


def _ids(split, epochs: int) -> list[list[int]]:
    """Each epoch's ids in the order trained, padding included (as ``fit`` gets them)."""
    out = [[] for _ in range(epochs)]
    for epoch, got, _ in _batches(split, epochs):
        out[epoch].extend(got.tolist())
    return out


@pytest.mark.slow
@settings(max_examples=12, **SETTINGS)
@given(
    layout=layouts(),
    weights=WEIGHTS,
    epoch_rows=EPOCH_ROWS,
    ranks=st.integers(1, 3),
    batch=st.integers(1, 5),
    budget=st.sampled_from([256 << 20, 600, 1]),
)
def test_a_mix_served_from_memory_trains_the_rows_it_streams_in_the_same_order(
    grown, tmp_path, layout, weights, epoch_rows, ranks, batch, budget
):
    # budget 256 MiB keeps both sources, 600 bytes the smaller one only (the other streams),
    # 1 byte neither; each rank's epochs must be the streamed mix's, row for row.
    files, deleted = layout
    drawn, _ = write_weighted(tmp_path / f"t{next(_tables)}", files, deleted)
    sources = (
        SourceConfig("drawn", drawn, weights[0]),
        SourceConfig("grown", grown, weights[1], since_version=0),
    )
    common = dict(sources=sources, features=("id",), epoch_rows=epoch_rows, shuffle_buffer=8)
    for rank in range(ranks):
        streamed = make_splits(DataConfig(**common, cache="never"), batch, rank, ranks).train
        cached = make_splits(DataConfig(**common, cache_max_bytes=budget), batch, rank, ranks).train
        assert _ids(cached, 3) == _ids(streamed, 3)
        kept = cached.stream.caches.kept  # per source: None (never read), a cache or False
        if budget == 256 << 20:
            assert False not in kept  # each source read was read once, then from memory
        elif budget == 1:
            assert not any(cached.stream.caches.cached())
