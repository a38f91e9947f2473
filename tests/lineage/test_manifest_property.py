"""The manifest's rows are the rows training reads, as a property over generated tables (files,
row groups, deletion vectors, column mapping, filters) and rank counts: the ids the shards
read in an epoch (counted from their batches) are the ids at the manifest's positions. And a
predicate's count over them, by time travel and from the kept lineage columns, is a scan's."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.data.tables.stats import count_rows
from keras_dl.lineage.matches import TableReader, count_where
from keras_dl.lineage.record import split_manifest
from tests.data.stream.test_exact_reads import SETTINGS, materialize, open_spec, tables


def manifest_ids(m, snap) -> Counter:
    out = Counter()
    for f, uri in zip(m.files, snap.files, strict=True):
        ids = pq.read_table(uri, columns=None).column(0).to_numpy()
        out.update(ids[f.positions()].tolist())
    return out


@settings(max_examples=40, **SETTINGS)
@given(
    spec=tables(),
    at_least=st.one_of(st.none(), st.integers(0, 3000)),
    shards=st.integers(1, 6),
    shuffle=st.booleans(),
    predicate=st.integers(0, 4000),
)
def test_the_manifest_names_the_rows_the_shards_read(
    spec, at_least, shards, shuffle, predicate, tmp_path
):
    path, _ = materialize(spec, tmp_path)
    snap = open_spec(spec, path)
    filters = [f"id >= {at_least}"] if at_least is not None else []
    if filters:
        snap = select(snap, parse_filters(filters, snap.schema))
    m, values = split_manifest("train", snap, filters, None, ["id"])
    stats = count_rows(snap, ["id"])
    assert m.rows == stats.rows == values.num_rows
    trained = manifest_ids(m, snap)
    assert sorted(values.column("id").to_pylist()) == sorted(trained.elements())
    if stats.rows >= shards:
        read = Counter()
        for shard in range(shards):
            for t in iter_epoch(
                snap, ["id"], stats, shard=shard, num_shards=shards, shuffle=shuffle, seed=1
            ):
                read.update(t.column("id").to_pylist())
        assert read == trained
    scan = sum(n for i, n in trained.items() if i < predicate)
    where = [f"id < {predicate}"]
    bare, _ = split_manifest("train", snap, filters, None)
    assert count_where(bare, where, lambda: None, TableReader()).rows == scan  # time travel
    assert count_where(m, where, lambda: values, TableReader()).rows == scan  # kept values
