"""Exactness, as properties over generated tables: every row the table holds at its version is
read once per epoch of its shard, deleted rows never, whatever the files, row groups, shards,
workers, shuffling and epochs (Hypothesis)."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns, read_table
from keras_dl.data.reader import iter_epoch
from keras_dl.data.rows import scan_table
from keras_dl.errors import DataError
from tests.data.delta_writer import write_delta

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def tables(draw):
    """A layout (files x row groups x rows), some deleted rows, and how it is stored."""
    files = draw(
        st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=3), min_size=1, max_size=4)
    )
    deleted = []
    for groups in files:
        rows = sum(groups)
        deleted.append(draw(st.lists(st.integers(0, rows - 1), unique=True, max_size=rows)))
    return {
        "files": files,
        "deleted": deleted,
        "mapping": draw(st.booleans()),
        "inline": draw(st.booleans()),
    }


def materialize(spec, root) -> tuple[str, Counter]:
    """Write ``spec`` as a Delta table; return its path and the ids a reader must return."""
    path = str(root / f"t-{uuid.uuid4().hex[:8]}")
    ids = itertools.count()
    files, live = [], Counter()
    for groups, deleted in zip(spec["files"], spec["deleted"]):
        tables_ = []
        start = next(ids) * 1000  # ids encode the file, so a duplicate is never a coincidence
        row = 0
        for n in groups:
            values = np.arange(start + row, start + row + n, dtype=np.int64)
            tables_.append(pa.table({"id": values, "x": values.astype(np.float32)}))
            row += n
        files.append(tables_)
        kept = set(range(row)) - set(deleted)
        live.update(start + r for r in kept)
    write_delta(path, files, spec["deleted"], mapping=spec["mapping"], inline=spec["inline"])
    return path, live


@settings(max_examples=60, **SETTINGS)
@given(
    spec=tables(),
    shards=st.integers(1, 4),
    workers=st.integers(1, 4),
    epochs=st.integers(1, 3),
    shuffle=st.booleans(),
)
def test_each_epoch_of_each_shard_reads_its_live_rows_exactly_once(
    spec, shards, workers, epochs, shuffle, tmp_path
):
    path, live = materialize(spec, tmp_path)
    snap = open_table(path)
    assert Counter(read_table(path).column("id").to_pylist()) == live
    stats = scan_table(snap, ["id"])
    assert stats.rows == sum(live.values())
    if stats.row_groups < shards:
        with pytest.raises(DataError, match=r"row group\(s\) but \d shards"):
            list(iter_epoch(snap, ["id"], stats, shard=0, num_shards=shards))
        return
    union = Counter()
    for shard in range(shards):
        first = None
        for epoch in range(epochs):
            read = Counter()
            for table in iter_epoch(
                snap,
                ["id"],
                stats,
                shard=shard,
                num_shards=shards,
                shuffle=shuffle,
                seed=epoch,
                workers=workers,
            ):
                read.update(table.column("id").to_pylist())
            assert sum(read.values()) == stats.shard_rows(shard, shards)
            assert max(read.values(), default=1) == 1  # nothing twice within an epoch
            first = read if first is None else first
            assert read == first  # every epoch of a shard reads the same rows
        # A seeded read repeats exactly, in order, whatever the number of workers (resume).
        orders = [
            [
                i
                for t in iter_epoch(
                    snap,
                    ["id"],
                    stats,
                    shard=shard,
                    num_shards=shards,
                    shuffle=shuffle,
                    seed=3,
                    workers=w,
                )
                for i in t.column("id").to_pylist()
            ]
            for w in (workers, workers, 1)
        ]
        assert orders[0] == orders[1] == orders[2]
        union.update(first)
    assert union == live  # the shards together: every live row, once


@settings(max_examples=15, **SETTINGS)
@given(
    spec=tables(),
    shards=st.integers(1, 3),
    batch=st.integers(1, 5),
    epochs=st.integers(1, 3),
    cache=st.sampled_from([0, 1 << 20]),  # data.cache off, or on (replayed from memory)
)
def test_training_and_evaluation_agree_with_steps_and_counts(
    spec, shards, batch, epochs, cache, tmp_path
):
    path, live = materialize(spec, tmp_path)
    snap = open_table(path)
    plan = plan_columns(snap, ["id"], None)
    stats = scan_table(snap, ["id"])
    per_shard = [stats.shard_rows(s, shards) for s in range(shards)]
    if stats.row_groups < shards or min(per_shard) < batch:
        return  # refused with a clear error; tested in test_tfdata
    evaluated = Counter()
    for shard in range(shards):
        ev = make_dataset(
            snap,
            plan,
            ReadOptions(
                batch, shard=shard, num_shards=shards, shuffle=False, cache_max_bytes=cache
            ),
        )
        got = np.concatenate([b.numpy() for b in ev.dataset]).tolist() if ev.steps else []
        assert len(got) == per_shard[shard] and ev.steps == -(-per_shard[shard] // batch)
        if ev.steps:  # a second evaluation (from memory when cached): the same rows in order
            assert np.concatenate([b.numpy() for b in ev.dataset]).tolist() == got
        evaluated.update(got)
        train = make_dataset(
            snap,
            plan,
            ReadOptions(
                batch, training=True, shard=shard, num_shards=shards, cache_max_bytes=cache
            ),
        )
        assert train.steps == min(per_shard) // batch
        batches = [b.numpy() for b in train.dataset.take(epochs * train.steps)]
        assert all(len(b) == batch for b in batches)
        for e in range(epochs):
            rows = np.concatenate(batches[e * train.steps : (e + 1) * train.steps]).tolist()
            assert len(set(rows)) == len(rows) and set(rows) <= set(got)
    assert evaluated == live


def test_resume_position_continues_the_same_epoch(tmp_path):
    path, _ = materialize(
        {"files": [[10, 10], [10]], "deleted": [[3, 4], []], "mapping": True, "inline": False},
        tmp_path,
    )
    snap = open_table(path)
    plan = plan_columns(snap, ["id"], None)
    options = ReadOptions(4, training=True, seed=7)
    whole = make_dataset(snap, plan, options)
    full = [b.numpy().tolist() for b in whole.dataset.take(3 * whole.steps)]
    resumed = make_dataset(snap, plan, options)
    resumed.start_at(whole.steps + 2)  # two steps into the second epoch
    rest = [b.numpy().tolist() for b in resumed.dataset.take(2 * whole.steps - 2)]
    assert rest == full[whole.steps + 2 :]


@pytest.mark.parametrize("mapping", [False, True])
@pytest.mark.parametrize("inline", [False, True])
def test_deleted_rows_are_gone_with_special_partition_values(tmp_path, inline, mapping):
    from tests.data.delta_writer import write_delta

    groups = [
        [
            pa.table({"id": np.arange(0, 5), "x": np.zeros(5)}),
            pa.table({"id": np.arange(5, 10), "x": np.ones(5)}),
        ],
        [pa.table({"id": np.arange(10, 14), "x": np.ones(4)})],
        [pa.table({"id": np.arange(14, 16), "x": np.ones(2)})],
    ]
    values = ["a b%c", "é=1/x", None]  # a space, %, a non-ASCII letter, =, / and a null
    path = str(tmp_path / "t")
    write_delta(
        path,
        groups,
        [[0, 9], [1, 2, 3], []],
        mapping=mapping,
        inline=inline,
        partition=("part name", values),
    )
    rows = read_table(path).to_pylist()
    assert sorted((r["id"], r["part name"]) for r in rows) == [
        *[(i, "a b%c") for i in range(1, 9)],
        (10, "é=1/x"),
        (14, None),
        (15, None),
    ]
    only = read_table(path, filters=["part name = é=1/x"], columns=["id"])
    assert only.column("id").to_pylist() == [10]
