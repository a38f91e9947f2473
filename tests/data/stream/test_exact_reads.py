"""Exactness, as properties over generated tables: every row the table holds at its version is
read once per epoch, on exactly one shard, deleted and filtered-out rows never, whatever the
files, row groups, shards, workers, batch sizes, shuffling, caching and epochs (Hypothesis).
Training epochs keep every row: every rank runs the same steps, and padding weighs zero."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns, read_table
from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.data.tables.stats import count_rows, scan_table
from keras_dl.errors import DataError
from tests.fixtures.delta_protocol import write_protocol_table

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def tables(draw):
    """A layout (files x row groups x rows), some deleted rows, a filter, and how it is stored."""
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
        "stats": draw(st.booleans()),  # numRecords in the log (no footers to plan) or not
        # A row filter on a data column: only a read can count its rows.
        "keep_below": draw(st.one_of(st.none(), st.integers(0, 4000))),
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
        live.update(start + r for r in kept if _kept(spec, start + r))
    write_protocol_table(
        path,
        files,
        spec["deleted"],
        mapping=spec["mapping"],
        inline=spec["inline"],
        stats=spec.get("stats", True),
    )
    return path, live


@contextlib.contextmanager
def no_footer_listing():
    """Fail if a Petastorm reader lists row groups by parsing every file's footer
    (``keras_dl.data.petastorm_compat.row_groups``: keras_dl's readers list their plan)."""
    from petastorm.etl import dataset_metadata

    listing = dataset_metadata._split_row_groups_from_footers

    def refuse(dataset):
        raise AssertionError("a keras_dl reader parsed every footer to list its row groups")

    dataset_metadata._split_row_groups_from_footers = refuse
    try:
        yield
    finally:
        dataset_metadata._split_row_groups_from_footers = listing


def open_spec(spec, path):
    snap = open_table(path)
    if spec.get("keep_below") is not None:
        snap = select(snap, parse_filters([f"x < {spec.get('keep_below')}"], snap.schema))
    return snap


def _kept(spec, row_id: int) -> bool:
    return spec.get("keep_below") is None or row_id < spec.get("keep_below")


@settings(max_examples=60, **SETTINGS)
@given(
    spec=tables(),
    shards=st.integers(1, 8),
    workers=st.integers(1, 4),
    epochs=st.integers(1, 3),
    shuffle=st.booleans(),
)
def test_each_epoch_reads_every_live_row_once_across_the_shards(
    spec, shards, workers, epochs, shuffle, tmp_path
):
    path, live = materialize(spec, tmp_path)
    snap = open_spec(spec, path)
    filters = [f"x < {spec.get('keep_below')}"] if spec.get("keep_below") is not None else None
    assert Counter(read_table(path, filters=filters).column("id").to_pylist()) == live
    stats = count_rows(snap, ["id"])
    assert stats.rows == sum(live.values()) == scan_table(snap, ["id"]).rows
    if stats.rows < shards:
        if stats.rows:
            with pytest.raises(DataError, match=r"live row\(s\) but \d shards"):
                list(iter_epoch(snap, ["id"], stats, shard=0, num_shards=shards))
        return
    sizes = [stats.shard_rows(s, shards) for s in range(shards)]
    assert sum(sizes) == stats.rows and max(sizes) - min(sizes) <= 1
    per_epoch = []
    for epoch in range(epochs):
        union = Counter()
        for shard in range(shards):
            with no_footer_listing():  # the readers list only the row groups planned
                read = [
                    i
                    for t in iter_epoch(
                        snap,
                        ["id"],
                        stats,
                        shard=shard,
                        num_shards=shards,
                        shuffle=shuffle,
                        seed=epoch,
                        workers=workers,
                    )
                    for i in t.column("id").to_pylist()
                ]
            assert len(read) == sizes[shard]
            union.update(read)
            if epoch == 0 and shard == 0:
                # A seeded read repeats exactly, in order, whatever the number of workers.
                again = iter_epoch(
                    snap,
                    ["id"],
                    stats,
                    shard=0,
                    num_shards=shards,
                    shuffle=shuffle,
                    seed=0,
                    workers=1,
                )
                assert [i for t in again for i in t.column("id").to_pylist()] == read
        assert union == live  # every live row, once, on exactly one shard
        per_epoch.append(union)


@settings(max_examples=30, **SETTINGS)
@given(
    spec=tables(),
    shards=st.integers(1, 8),
    batch=st.one_of(st.integers(1, 8), st.integers(9, 300)),
    epochs=st.integers(1, 3),
    shuffle=st.booleans(),
    cache=st.sampled_from([0, 1 << 20]),  # data.cache off, or on (replayed from memory)
)
@pytest.mark.slow  # 25 s on 2 cores
def test_every_training_epoch_trains_every_row_once_with_equal_steps(
    spec, shards, batch, epochs, shuffle, cache, tmp_path
):
    path, live = materialize(spec, tmp_path)
    snap = open_spec(spec, path)
    plan = plan_columns(snap, ["id"], "x")
    rows = sum(live.values())
    if rows < max(shards, 1) or rows == 0:
        return  # refused with a clear error (tested in test_tfdata)
    splits = [
        make_dataset(
            snap,
            plan,
            ReadOptions(
                batch,
                training=True,
                shard=r,
                num_shards=shards,
                shuffle=shuffle,
                shuffle_buffer=7,
                cache_max_bytes=cache,
            ),
        )
        for r in range(shards)
    ]
    steps = {s.steps for s in splits}
    assert len(steps) == 1  # every rank runs the same steps
    steps = steps.pop()
    iterators = [iter(s.dataset) for s in splits]
    for epoch in range(epochs):
        trained = Counter()
        for it in iterators:
            for _ in range(steps):
                element = next(it)
                ids = element[0].numpy()
                if shards > 1:
                    weights = element[2].numpy()
                    assert len(ids) == batch  # padded to whole batches
                    assert set(np.unique(weights)) <= {0.0, 1.0}
                    ids = ids[weights > 0]
                trained.update(ids.tolist())
        assert trained == live, epoch  # every row once per epoch; padding weighs zero


def test_cached_and_streamed_epochs_are_the_same_rows_in_the_same_order(tmp_path):
    path, _ = materialize(
        {
            "files": [[10, 7], [12, 3, 9]],
            "deleted": [[1, 2], []],
            "mapping": False,
            "inline": True,
            "stats": True,
            "keep_below": None,
        },
        tmp_path,
    )
    snap = open_table(path)
    plan = plan_columns(snap, ["id"], "x")
    for shards in (1, 3):
        for shard in range(shards):
            runs = []
            for cache in (0, 1 << 20):
                split = make_dataset(
                    snap,
                    plan,
                    ReadOptions(
                        4,
                        training=True,
                        shard=shard,
                        num_shards=shards,
                        shuffle_buffer=5,
                        cache_max_bytes=cache,
                    ),
                )
                runs.append([e[0].numpy().tolist() for e in split.dataset.take(3 * split.steps)])
            assert runs[0] == runs[1]


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
    from tests.fixtures.delta_protocol import write_protocol_table

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
    write_protocol_table(
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
