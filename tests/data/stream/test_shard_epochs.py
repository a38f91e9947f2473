"""Footer checks, dtypes and shapes, the preprocess hook, and bad input named by file and column."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from keras_dl.config import DataConfig
from keras_dl.data import ReadOptions, make_dataset, make_splits, open_table, plan_columns
from keras_dl.data.stream.shard_epochs import iter_epoch_arrays
from keras_dl.data.tables.stats import scan_table
from keras_dl.errors import DataError
from tests.conftest import write_test_table

NUMERIC = {
    "i8": pa.int8(),
    "i16": pa.int16(),
    "i32": pa.int32(),
    "i64": pa.int64(),
    "u8": pa.uint8(),
    "u16": pa.uint16(),
    "u32": pa.uint32(),
    "u64": pa.uint64(),
    "f32": pa.float32(),
    "f64": pa.float64(),
    "b": pa.bool_(),
}


def _typed_table(n=24, fixed=False):
    cols = {}
    for name, t in NUMERIC.items():
        values = np.arange(n) % 2 == 1 if name == "b" else np.arange(n) % 100
        cols[name] = pa.array(np.asarray(values).astype(t.to_pandas_dtype()), t)
    flat = pa.array(np.arange(3 * n, dtype=np.float32))
    offsets = pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32))
    # Parquet keeps a fixed_size_list; Delta stores every list as a variable-size list.
    cols["fixed"] = (
        pa.FixedSizeListArray.from_arrays(flat, 3)
        if fixed
        else pa.ListArray.from_arrays(offsets, flat)
    )
    cols["grid"] = pa.array(
        [[[i, i + 1, i + 2], [i, i, i]] for i in range(n)], pa.list_(pa.list_(pa.int32()))
    )
    cols["name"] = pa.array([f"row{i}" for i in range(n)])
    cols["label"] = pa.array(np.arange(n) % 3)
    return pa.table(cols)


def test_every_numeric_type_lists_and_strings_arrive_as_dense_typed_tensors(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(_typed_table(fixed=True), d / "a.parquet", row_group_size=8)
    snap = open_table(str(d))
    with pytest.raises(DataError, match=r"'grid'.*nested list \(shape \(2, 3\)\).*flattened"):
        plan_columns(snap, (), "label", accept=("numeric", "string"))
    features = [n for n in snap.schema.names if n not in ("grid", "label")]
    plan = plan_columns(snap, features, "label", accept=("numeric", "string"))
    split = make_dataset(snap, plan, ReadOptions(batch_size=24))
    x, y = next(iter(split.dataset))
    for name, t in NUMERIC.items():
        expected = np.dtype(t.to_pandas_dtype()).name
        assert x[name].dtype.name == expected and x[name].shape == (24,), name
    assert x["fixed"].shape == (24, 3) and x["fixed"].dtype.name == "float32"
    order = np.argsort(x["i64"].numpy())
    np.testing.assert_array_equal(x["fixed"].numpy()[order][:, 1], 3 * np.arange(24) + 1)
    np.testing.assert_array_equal(x["u64"].numpy()[order], np.arange(24))
    assert x["name"].dtype.name == "string"
    assert sorted(x["name"].numpy().tolist())[:2] == [b"row0", b"row1"]
    assert y.dtype.name == "int64"


def test_only_the_selected_features_and_the_label_are_read(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _typed_table())
    snap = open_table(path)
    plan = plan_columns(snap, ("f32", "fixed"), "label")
    assert plan.columns == ["f32", "fixed", "label"]
    first = next(iter_epoch_arrays(snap, plan, scan_table(snap, plan.columns)))
    assert set(first) == {"f32", "fixed", "label"}


def test_preprocess_hook_runs_vectorized_on_whole_batches(tmp_path):
    import tensorflow as tf

    path = str(tmp_path / "t")
    write_deltalake(path, _typed_table(40))
    seen_ranks = []

    def hook(x, y):
        seen_ranks.append(x.shape.rank)  # traced once: a batch, not a row
        return tf.cast(x, tf.float32) * 2.0, y + 10

    data = make_splits(
        DataConfig(table=path, features=("i32",), shuffle=False), batch_size=8, preprocess=hook
    )
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in data.train.dataset.take(5)])
    assert seen_ranks == [1]
    assert all(x.shape == (8,) for x in xs)
    assert sorted(np.concatenate(xs).tolist()) == [2.0 * i for i in range(40)]
    assert np.concatenate(ys).min() >= 10


def _delta(path, n=40, rows_per_group=10, **cols):
    table = pa.table({"x": np.arange(n, dtype=np.float32), "label": np.arange(n) % 2, **cols})
    write_test_table(path, table, rows_per_group, rows_per_file=2 * rows_per_group)
    return path


def test_corrupt_parquet_file_is_named(tmp_path):
    path = _delta(str(tmp_path / "t"))
    victim = open_table(path).files[1]
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) - 12)
        f.write(b"garbage!")  # the footer is gone
    with pytest.raises(DataError, match=rf"File '{victim}'.*not readable Parquet.*restore"):
        make_splits(DataConfig(table=path), batch_size=4)


def test_schema_differing_between_files_is_named(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(pa.table({"x": [1.0, 2.0], "label": [0, 1]}), d / "a.parquet")
    pq.write_table(pa.table({"x": ["1", "2"], "label": [0, 1]}), d / "b.parquet")
    with pytest.raises(DataError, match=r"Column 'x' is string in file '.*b.parquet'.*differ"):
        make_splits(DataConfig(table=str(d)), batch_size=2)
    pq.write_table(pa.table({"label": [0, 1]}), d / "b.parquet")
    with pytest.raises(DataError, match=r"File '.*b.parquet'.*has no column 'x'"):
        make_splits(DataConfig(table=str(d)), batch_size=2)


def test_nulls_in_a_feature_are_named_by_file_and_row_group(tmp_path):
    values = pa.array([None if i == 25 else float(i) for i in range(40)], pa.float32())
    path = _delta(str(tmp_path / "t"), z=values)
    with pytest.raises(DataError, match=r"Column 'z' has 1 null.*file '.*\.parquet', row group 0"):
        make_splits(DataConfig(table=path, features=("x", "z")), batch_size=4)
    # Leaving the column out reads fine.
    make_splits(DataConfig(table=path, features=("x",)), batch_size=4)


def test_ragged_list_column_is_named_by_file_and_row_group(tmp_path):
    ragged = pa.array([[1.0] * (3 if i != 17 else 2) for i in range(40)], pa.list_(pa.float32()))
    path = _delta(str(tmp_path / "t"), v=ragged)
    # Row group 0 sets the shape at plan time; row group 1 is ragged and named when read.
    data = make_splits(DataConfig(table=path, features=("v",)), batch_size=4)
    with pytest.raises(DataError, match=r"'v' has rows of different lengths \(2 to 3\).*group 1"):
        for _ in data.train.batches():  # one epoch
            pass
    # Ragged in the first row group: refused before any read.
    first = pa.array([[1.0] * (3 if i != 2 else 2) for i in range(20)], pa.list_(pa.float32()))
    path = _delta(str(tmp_path / "u"), n=20, v=first)  # one file: its row group 0 is planned
    with pytest.raises(DataError, match=r"'v' has rows of different lengths.*row group 0"):
        make_splits(DataConfig(table=path, features=("v",)), batch_size=4)


def test_list_lengths_differing_between_row_groups_stop_the_read(tmp_path):
    lists = pa.array([[1.0] * (3 if i < 20 else 4) for i in range(40)], pa.list_(pa.float32()))
    path = _delta(str(tmp_path / "t"), v=lists)
    data = make_splits(DataConfig(table=path, features=("v",), shuffle=False), batch_size=4)
    with pytest.raises(DataError, match=r"'v'.*shape \([34],\) where \([34],\) was expected"):
        for _ in data.train.batches():  # one epoch
            pass


def test_a_read_error_in_your_own_model_fit_is_the_reader_s_data_error(tmp_path):
    import keras
    import tensorflow as tf

    lists = pa.array([[1.0] * (3 if i < 20 else 4) for i in range(40)], pa.list_(pa.float32()))
    path = _delta(str(tmp_path / "t"), v=lists)
    data = make_splits(DataConfig(table=path, features=("v",), shuffle=False), batch_size=4)
    model = keras.Sequential([keras.Input(data.plan.features[0].shape), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    fit = dict(steps_per_epoch=data.train.steps, epochs=1, verbose=0)
    shape = r"'v'.*shape \([34],\) where \([34],\) was expected"
    # tf.data raises the generator's error as its own, with the DataError's text in it ...
    with pytest.raises(tf.errors.OpError, match=rf"DataError: .*{shape}"):
        model.fit(data.train.dataset, **fit)
    # ... and inside data.original_errors() as the DataError itself.
    with pytest.raises(DataError, match=shape), data.original_errors():
        model.fit(data.train.dataset, **fit)
    # Other errors, TensorFlow's too, pass unchanged after the reader's.
    assert data.train.errors
    with pytest.raises(tf.errors.InvalidArgumentError, match="not 2"), data.original_errors():
        tf.debugging.assert_equal(1, 2, message="not 2")


def test_a_finite_read_returns_every_row_group_exactly_once(tmp_path):
    # Petastorm 0.13.1's thread pool could end a one-epoch read with row groups in flight (1 in
    # 5 reads of 10 row groups here); petastorm_compat.race closes that race.
    path = _delta(str(tmp_path / "t"), n=100, rows_per_group=10)
    snap = open_table(path)
    plan = plan_columns(snap, ("x",), "label")
    stats = scan_table(snap, plan.columns)
    for i in range(60):
        shuffle = i % 2 == 0
        chunks = iter_epoch_arrays(snap, plan, stats, shuffle=shuffle, seed=i, workers=1 + i % 4)
        rows = np.concatenate([a["x"] for a in chunks])
        assert sorted(rows.tolist()) == list(range(100)), (i, len(rows))
    # Sharded: each shard its own row groups, together every row once.
    seen = []
    for shard in range(3):
        chunks = iter_epoch_arrays(snap, plan, stats, shard=shard, num_shards=3)
        rows = np.concatenate([a["x"] for a in chunks]).tolist()
        assert len(rows) == stats.shard_rows(shard, 3) and len(set(rows)) == len(rows)
        seen.extend(rows)
    assert sorted(seen) == list(range(100))
