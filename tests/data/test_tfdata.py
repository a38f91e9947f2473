import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from keras_dl.config import DataConfig
from keras_dl.data import ReadOptions, make_dataset, make_splits, open_table, plan_columns
from keras_dl.errors import DataError
from tests.conftest import write_delta


def _write(path, n=1000, rows_per_group=100, **extra):
    table = pa.table(
        {
            "f": np.arange(n, dtype=np.float32),
            "v": pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32())),
            "label": np.arange(n, dtype=np.int64) % 3,
            **extra,
        }
    )
    write_delta(path, table, rows_per_group, rows_per_file=10 * rows_per_group)
    return path


def _collect(split, steps):
    xs, ys = [], []
    for x, y in split.dataset.take(steps):
        xs.append(x)
        ys.append(y.numpy())
    return xs, np.concatenate(ys)


def test_every_row_arrives_once_per_epoch_as_dense_batches(tmp_path):
    snap = open_table(_write(str(tmp_path / "t")))
    plan = plan_columns(snap, ("f", "v"), "label")
    assert [(s.name, s.dtype, s.shape) for s in plan.features] == [
        ("f", "float32", ()),
        ("v", "float32", (4,)),
    ]
    split = make_dataset(snap, plan, ReadOptions(batch_size=32))
    assert split.steps == 32 and split.stats.rows == 1000 and split.stats.row_groups == 10
    xs, _ = _collect(split, split.steps)
    f = np.concatenate([x["f"].numpy() for x in xs])
    v = np.concatenate([x["v"].numpy() for x in xs])
    assert sorted(f.tolist()) == list(range(1000))
    assert v.shape == (1000, 4) and np.all(v[:, 0] == f)


def test_training_split_repeats_shuffled_with_equal_steps_per_shard(tmp_path):
    snap = open_table(_write(str(tmp_path / "t")))
    plan = plan_columns(snap, ("f",), "label")
    shards = [
        make_dataset(
            snap,
            plan,
            ReadOptions(batch_size=16, training=True, shard=r, num_shards=2, shuffle_buffer=200),
        )
        for r in range(2)
    ]
    # Steps come from row counts over the whole world: the same on every rank.
    assert shards[0].steps == shards[1].steps == 1000 // 32
    seen = []
    for s in shards:
        batches = [x.numpy() for x, _ in s.dataset.take(s.steps * 3)]  # three epochs, no re-open
        assert all(b.shape == (16,) for b in batches)
        seen.append(np.concatenate(batches[: s.steps]))
    # The shards read disjoint row groups, and the order is shuffled.
    assert not set(seen[0][:100].tolist()) & set(seen[1][:100].tolist())
    assert not np.all(np.diff(seen[0]) > 0)


def test_fewer_row_groups_than_shards_says_how_to_fix(tmp_path):
    snap = open_table(_write(str(tmp_path / "t"), n=100, rows_per_group=100))
    plan = plan_columns(snap, ("f",), "label")
    with pytest.raises(DataError, match=r"1 row group\(s\) but 2 shards.*more, smaller row groups"):
        make_dataset(snap, plan, ReadOptions(batch_size=8, training=True, shard=0, num_shards=2))


def test_missing_column_lists_the_columns_the_table_has(tmp_path):
    path = _write(str(tmp_path / "t"))
    with pytest.raises(DataError, match=r"'pixels'.*data.features.*has these columns: f, v, label"):
        make_splits(DataConfig(table=path, features=("pixels",)), batch_size=8)
    with pytest.raises(DataError, match=r"'target'.*data.label"):
        make_splits(DataConfig(table=path, label="target"), batch_size=8)


def test_non_numeric_feature_is_rejected_by_name(tmp_path):
    path = _write(str(tmp_path / "t"), n=10, rows_per_group=5, name=[f"r{i}" for i in range(10)])
    with pytest.raises(DataError, match=r"Column 'name'.*type string.*cannot use as a feature"):
        make_splits(DataConfig(table=path), batch_size=2)


def test_empty_table_is_a_clear_error(tmp_path):
    path = str(tmp_path / "empty")
    write_deltalake(
        path, pa.table({"f": pa.array([], pa.float32()), "label": pa.array([], pa.int64())})
    )
    with pytest.raises(DataError, match="is empty|has no rows"):
        make_splits(DataConfig(table=path), batch_size=2)


def test_digits_splits_come_from_the_split_partition(digits_table):
    data = make_splits(
        DataConfig(table=digits_table, features=("pixels",), split_column="split"), batch_size=32
    )
    assert data.train.stats.rows + data.validation.stats.rows + data.test.stats.rows == 1797
    assert data.test.stats.rows == 360
    x, y = next(iter(data.train.dataset))
    assert x.shape == (32, 64) and x.dtype.name == "float32" and y.dtype.name == "int64"
    assert data.snapshot.lineage["data.version"] == "0"


def test_uneven_shards_still_run_equal_full_steps_and_split_the_row_groups(tmp_path):
    snap = open_table(_write(str(tmp_path / "t")))  # 10 row groups of 100 rows
    plan = plan_columns(snap, ("f",), "label")
    # One pass per rank: the 10 row groups split 4/3/3, disjoint, covering every row.
    passes = [
        np.concatenate(
            [
                x.numpy()
                for x, _ in make_dataset(
                    snap, plan, ReadOptions(batch_size=16, shard=r, num_shards=3)
                ).dataset
            ]
        )
        for r in range(3)
    ]
    assert sorted(len(p) for p in passes) == [300, 300, 400]
    assert sorted(np.concatenate(passes).tolist()) == list(range(1000))
    # Training: every rank runs the same steps of full batches, as many as the smallest shard
    # fills (300 // 16), and no row comes twice within one epoch of a rank.
    for r in range(3):
        split = make_dataset(
            snap, plan, ReadOptions(batch_size=16, training=True, shard=r, num_shards=3)
        )
        assert split.steps == 300 // 16
        epochs = [[], []]
        for i, (x, _) in enumerate(split.dataset.take(2 * split.steps)):
            assert int(x.shape[0]) == 16
            epochs[i // split.steps].extend(x.numpy().tolist())
        for rows in epochs:
            assert len(set(rows)) == len(rows) == split.steps * 16
            assert set(rows) <= set(passes[r].tolist())


def test_deterministic_order_repeats_run_after_run_and_follows_the_seed(tmp_path):
    path = _write(str(tmp_path / "t"))

    def order(seed):
        data = make_splits(
            DataConfig(
                table=path, features=("f",), deterministic=True, seed=seed, shuffle_buffer=100
            ),
            batch_size=50,
        )
        return np.concatenate([x.numpy() for x, _ in data.train.dataset.take(40)])

    first, again, other = order(1), order(1), order(2)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert not np.all(np.diff(first[:1000]) > 0)  # shuffled, not sorted
    # A buffer of one row group keeps epochs apart: the second is another permutation.
    assert sorted(first[:1000].tolist()) == sorted(first[1000:].tolist()) == list(range(1000))
    assert not np.array_equal(first[:1000], first[1000:])


def test_each_training_epoch_reads_every_row_once_and_reshuffles(tmp_path):
    snap = open_table(_write(str(tmp_path / "t")))  # 1000 rows: 31 batches of 32, 8 left out
    split = make_dataset(snap, plan_columns(snap, ("f",), "label"), ReadOptions(32, training=True))
    assert split.steps == 31
    rows = np.concatenate([x.numpy() for x, _ in split.dataset.take(3 * split.steps)])
    epochs = rows.reshape(3, 31 * 32).tolist()
    for epoch in epochs:
        assert len(set(epoch)) == 31 * 32 and set(epoch) <= set(range(1000))
    assert epochs[0] != epochs[1] != epochs[2]  # a new seeded order every epoch


def test_validation_can_come_from_a_second_table(tmp_path):
    train = _write(str(tmp_path / "train"))
    val = _write(str(tmp_path / "val"), n=300)
    data = make_splits(DataConfig(table=train, features=("f", "v"), validation_table=val), 32)
    assert data.train.stats.rows == 1000 and data.validation.stats.rows == 300
    assert data.validation.steps == 10 and data.test is None
    rows = sum(int(y.shape[0]) for _, y in data.validation.dataset)
    assert rows == 300


def test_a_shard_left_empty_by_filters_is_refused_before_training(tmp_path):
    # 10 row groups of 100 rows; the filter keeps rows of even row groups only, which all go to
    # shard 0 of 2: shard 1 would wait forever in its first collective.
    path = _write(str(tmp_path / "t"), group=np.repeat(np.arange(10), 100))
    data = DataConfig(table=path, features=("f",), filters=("group in 0|2|4|6|8",))
    with pytest.raises(DataError, match=r"shard 1 of 2 has 0 row\(s\) after deletions and filters"):
        make_splits(data, batch_size=16, rank=0, world_size=2)
    # Every rank refuses, not only the empty one: they must agree before any step.
    with pytest.raises(DataError, match=r"shard 1 of 2 has 0 row"):
        make_splits(data, batch_size=16, rank=1, world_size=2)


@pytest.mark.parametrize("batch", [1, 7, 32, 300])
def test_blocks_cut_any_chunk_sizes_into_whole_batches_in_order(batch):
    from keras_dl.data.tfdata import _as_block, _blocks

    rng = np.random.default_rng(batch)
    sizes = rng.integers(1, 700, size=12)
    values = np.arange(int(sizes.sum()))
    out, carry, at = [], None, 0
    for n in sizes:
        chunk = {"a": values[at : at + n], "b": values[at : at + n, None] * 2}
        at += n
        block, carry = _blocks(chunk, carry, batch)
        if block is not None:
            assert block["a"].shape[1:] == (batch,) and block["b"].shape[1:] == (batch, 1)
            out.extend(block["a"])
    if carry is not None:
        assert len(carry["a"]) < batch
        out.extend(_as_block(carry)["a"])
    assert np.array_equal(np.concatenate(out), values)


@pytest.mark.parametrize("training", [False, True])
def test_a_preprocess_hook_sees_the_same_rows_in_the_same_order(tmp_path, training):
    snap = open_table(_write(str(tmp_path / "t"), n=1000, rows_per_group=90))
    plan = plan_columns(snap, ("f", "v"), "label")
    options = ReadOptions(batch_size=24, training=training, shuffle_buffer=200)
    plain = make_dataset(snap, plan, options)
    hooked = make_dataset(snap, plan, options, lambda x, y: (x, y + 10))
    take = plain.steps * (2 if training else 1)
    a = [(x["f"].numpy(), y.numpy()) for x, y in plain.dataset.take(take)]
    b = [(x["f"].numpy(), y.numpy()) for x, y in hooked.dataset.take(take)]
    assert [len(f) for f, _ in a] == [len(f) for f, _ in b]
    assert all(
        np.array_equal(fa, fb) and np.array_equal(ya + 10, yb) for (fa, ya), (fb, yb) in zip(a, b)
    )
    sizes = [len(f) for f, _ in a]
    if training:
        assert set(sizes) == {24} and len(a) == 2 * (1000 // 24)
    else:
        assert sizes == [24] * (1000 // 24) + [1000 % 24]
        assert sorted(np.concatenate([f for f, _ in a]).tolist()) == list(range(1000))
