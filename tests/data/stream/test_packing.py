"""Packed features (data.pack_features): the scalar numeric features of one dtype read as one
(rows, k) tensor. Which columns pack, and that a packed epoch yields exactly the rows of an
unpacked one, on every rank, cached or not, with deleted rows (Hypothesis)."""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns
from keras_dl.data.stream.arrays import to_arrays
from keras_dl.data.stream.blocks import WEIGHT
from keras_dl.data.stream.features import FeatureSpec, pack_features
from keras_dl.data.stream.packing import pack, unpack
from keras_dl.data.stream.signature import input_signature
from keras_dl.errors import DataError
from tests.conftest import write_test_table
from tests.data.stream.test_exact_reads import SETTINGS, tables
from tests.fixtures.delta_protocol import write_protocol_table

# Features by dtype: int64 id, e, g; float32 x, a; float64 c, f; int32 h alone (not packed).
COLUMNS = ("id", "e", "x", "a", "c", "h", "g", "f")
PACKS = {
    "__packed_int64": ("id", "e", "g"),
    "__packed_float32": ("x", "a"),
    "__packed_float64": ("c", "f"),
}


def _columns(ids: np.ndarray) -> dict:
    """Every column a function of the row id, so a row torn between columns is seen."""
    return {
        "id": ids,
        "e": ids * 3 - 7,
        "x": ids.astype(np.float32),
        "a": (ids * 0.5).astype(np.float32),
        "c": ids * 1.25,
        "h": (ids % 1000).astype(np.int32),
        "g": ids + 11,
        "f": -ids / 3.0,
        "y": (ids % 3).astype(np.float32),  # the label: float32 like x and a, never packed
        "w": (ids % 4 + 1).astype(np.float64),  # the weight column: float64, never packed
    }


def _write(spec, root) -> tuple[str, Counter]:
    """``spec`` (tests.data.stream.test_exact_reads.tables, its filter unused) as a Delta table."""
    path = str(root / f"t-{uuid.uuid4().hex[:8]}")
    files, live = [], Counter()
    for file_id, (groups, deleted) in enumerate(zip(spec["files"], spec["deleted"])):
        start, row, parts = file_id * 1000, 0, []
        for n in groups:
            parts.append(pa.table(_columns(np.arange(start + row, start + row + n))))
            row += n
        files.append(parts)
        live.update(start + r for r in set(range(row)) - set(deleted))
    write_protocol_table(
        path, files, spec["deleted"], mapping=spec["mapping"], inline=spec["inline"]
    )
    return path, live


def _epoch(it, steps: int, plan) -> Counter:
    """One epoch's rows (padding of weight 0 dropped) as tuples of every column and the label."""
    out = Counter()
    for _ in range(steps):
        features, label, *weight = next(it)
        values = {k: v.numpy() for k, v in features.items()}
        if any(s.members for s in plan.features):
            assert set(values) == {*PACKS, "h"}
            values = unpack(values, plan)
        keep = weight[0].numpy() > 0 if weight else np.ones(len(label), bool)
        rows = zip(*(values[c][keep].tolist() for c in COLUMNS), label.numpy()[keep].tolist())
        out.update(rows)
    return out


def _expected(row_id: int) -> tuple:
    values = _columns(np.array([row_id]))
    return (*(values[c][0].item() for c in COLUMNS), values["y"][0].item())


@settings(max_examples=25, **SETTINGS)
@given(
    spec=tables(),
    shards=st.integers(1, 4),
    batch=st.integers(1, 9),
    epochs=st.integers(1, 2),
    cache=st.sampled_from([0, 1 << 20]),  # data.cache off, or on (replayed from memory)
    weighted=st.booleans(),
)
@pytest.mark.slow  # 45 s on 2 cores
def test_a_packed_epoch_yields_the_rows_of_an_unpacked_one_on_every_rank(
    spec, shards, batch, epochs, cache, weighted, tmp_path
):
    path, live = _write(spec, tmp_path)
    if sum(live.values()) < shards:
        return  # refused with a clear error (tested in test_tfdata)
    snap = open_table(path)
    weight = "w" if weighted else None
    plans = [plan_columns(snap, COLUMNS, "y", weight=weight, pack=p) for p in (False, True)]
    assert {s.name: s.members for s in plans[1].features if s.members} == PACKS
    assert sorted(plans[1].columns) == sorted(plans[0].columns)
    ranks = []
    for rank in range(shards):
        options = ReadOptions(
            batch,
            training=True,
            shard=rank,
            num_shards=shards,
            shuffle_buffer=5,
            cache_max_bytes=cache,
        )
        splits = [make_dataset(snap, plan, options) for plan in plans]
        assert splits[0].steps == splits[1].steps
        ranks.append([(iter(s.dataset), s.steps, plan) for s, plan in zip(splits, plans)])
    for epoch in range(epochs):
        union = Counter()
        for rank, pair in enumerate(ranks):
            unpacked, packed = (_epoch(*p) for p in pair)
            assert packed == unpacked, (rank, epoch)
            assert all(row == _expected(row[0]) for row in packed)  # no row torn apart
            union.update({row[0]: n for row, n in packed.items()})
        assert union == live, epoch  # every live row once per epoch, on exactly one rank


def _table(tmp_path, columns: dict) -> str:
    path = str(tmp_path / f"t-{uuid.uuid4().hex[:8]}")
    write_test_table(path, pa.table(columns), 100)
    return path


def test_only_scalar_numeric_features_of_a_shared_dtype_pack(tmp_path):
    n = np.arange(4)
    columns = {
        "f1": n.astype(np.float32),
        "s": pa.array(["a", "b", "c", "d"]),
        "f2": n.astype(np.float32),
        "i1": n.astype(np.int64),
        "d1": n.astype(np.float64),  # alone of its dtype: stays a column
        "b1": n > 1,
        "b2": n > 2,  # booleans never pack
        "vec": pa.array([[1.0, 2.0]] * 4, pa.list_(pa.float32())),  # lists never pack
        "i2": n.astype(np.int64) * 10,
        "label": n.astype(np.float32),  # the label never packs
        "w": n.astype(np.float32),  # nor the weight column
    }
    path = _table(tmp_path, columns)
    snap = open_table(path)
    plan = plan_columns(snap, (), "label", accept=("numeric", "string"), weight="w", pack=True)
    assert [(s.name, s.shape, s.members) for s in plan.features] == [
        ("__packed_float32", (2,), ("f1", "f2")),
        ("s", (), ()),
        ("__packed_int64", (2,), ("i1", "i2")),
        ("d1", (), ()),
        ("b1", (), ()),
        ("b2", (), ()),
        ("vec", (2,), ()),
    ]
    assert plan.label.name == "label" and plan.weight.name == "w"
    assert plan.columns == ["f1", "f2", "s", "i1", "i2", "d1", "b1", "b2", "vec", "label", "w"]
    off = plan_columns(snap, (), "label", accept=("numeric", "string"), weight="w")
    assert all(not s.members for s in off.features) and len(off.features) == 9
    # The reader's arrays: one C-contiguous (rows, k) array per pack, columns in member order.
    table = pa.table(columns)
    arrays = to_arrays(table, plan, snap)
    packed = arrays["__packed_int64"]
    assert packed.flags.c_contiguous and packed.dtype == np.int64 and packed.shape == (4, 2)
    np.testing.assert_array_equal(packed, np.stack([n, n * 10], 1))
    assert set(arrays) == {s.name for s in plan.specs} | {WEIGHT}
    spec = input_signature(plan)[0]["__packed_float32"]
    assert tuple(spec.shape) == (None, 2) and spec.dtype.name == "float32"
    # The Petastorm rows path packs columns read one by one the same way.
    columns = {c: table.column(c).to_numpy() for c in ("f1", "f2", "i1", "i2")}
    repacked = pack(columns, plan)
    np.testing.assert_array_equal(repacked["__packed_int64"], packed)
    assert "i1" not in repacked and "f1" not in repacked
    assert list(unpack(repacked, plan)) == ["f1", "f2", "i1", "i2"]


def test_a_column_named_like_a_packed_feature_is_refused_by_name(tmp_path):
    n = np.arange(3, dtype=np.float32)
    path = _table(tmp_path, {"a": n, "b": n, "__packed_x": n, "label": n})
    snap = open_table(path)
    with pytest.raises(DataError, match=r"column named '__packed_x'.*data.pack_features=false"):
        plan_columns(snap, ("a", "b"), "label", pack=True)
    assert plan_columns(snap, ("a", "b"), "label").features[0].name == "a"  # packing off: fine
    specs = [FeatureSpec("a", "float32"), FeatureSpec("b", "float64")]
    assert pack_features(specs, ["a", "b", "__packed_x"]) == tuple(specs)  # nothing packs


def test_a_null_in_a_packed_column_is_refused_naming_the_column(tmp_path):
    path = _table(
        tmp_path,
        {
            "a": pa.array([1.0, None, 3.0], pa.float32()),
            "b": np.ones(3, np.float32),
            "label": np.ones(3, np.float32),
        },
    )
    snap = open_table(path)
    plan = plan_columns(snap, ("b", "a"), "label", pack=True)
    assert plan.features[0].members == ("b", "a")
    with pytest.raises(DataError, match=r"Column 'a' has 1 null value\(s\) in file"):
        make_dataset(snap, plan, ReadOptions(2))  # from the footers, before any row is read
    table = pa.table({"a": [1.0, None], "b": [1.0, 2.0], "label": [0.0, 1.0]})
    with pytest.raises(DataError, match=r"Column 'a' of table .* 1 null value\(s\)"):
        to_arrays(table, plan, snap)  # and in the rows read


def test_arrow_packs_members_of_the_packed_dtype_and_numpy_casts_the_others(tmp_path):
    from keras_dl.data.stream import arrays

    snap = open_table(_table(tmp_path, {"a": np.arange(3, dtype=np.int32), "label": [0.0] * 3}))
    spec = FeatureSpec("__packed_int64", "int64", (3,), "numeric", ("b", "a", "c"))
    values = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [-1, 0, 2**40, 9]}
    same = pa.table({k: pa.array(v, pa.int64()) for k, v in values.items()})
    cast = pa.table({**same.to_pydict(), "a": pa.array(values["a"], pa.int32())})
    expected = np.array([values[k] for k in ("b", "a", "c")], np.int64).T
    for table in (same, cast, same.slice(1), pa.concat_tables([same.slice(0, 2), same.slice(2)])):
        packed = arrays._packed(table, spec, snap)  # Arrow's to_tensor; numpy for ``cast``
        rows = expected[1:] if len(table) == 3 else expected
        assert packed.dtype == np.int64 and packed.flags.c_contiguous
        assert np.array_equal(packed, rows)
    empty = arrays._packed(same.slice(0, 0), spec, snap)
    assert empty.shape == (0, 3) and empty.dtype == np.int64
