import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from keras_dl.config import DataConfig
from keras_dl.data import ReadOptions, make_dataset, make_splits, open_table, plan_columns
from keras_dl.errors import DataError
from tests.conftest import write_test_table


def _write(path, n=1000, rows_per_group=100, **extra):
    table = pa.table(
        {
            "f": np.arange(n, dtype=np.float32),
            "v": pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32())),
            "label": np.arange(n, dtype=np.int64) % 3,
            **extra,
        }
    )
    write_test_table(path, table, rows_per_group, rows_per_file=10 * rows_per_group)
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
    # Counted from the Delta log alone (numRecords): no footer is opened to plan the epoch.
    assert split.steps == 32 and split.stats.rows == 1000 and split.stats.file_rows == (1000,)
    xs, _ = _collect(split, split.steps)
    f = np.concatenate([x["f"].numpy() for x in xs])
    v = np.concatenate([x["v"].numpy() for x in xs])
    assert sorted(f.tolist()) == list(range(1000))
    assert v.shape == (1000, 4) and np.all(v[:, 0] == f)


def _epochs(split, epochs):
    """Per epoch: the real rows (weight 1) and the weights of the padding (weight 0)."""
    out = []
    it = iter(split.dataset)
    for _ in range(epochs):
        rows, pad = [], []
        for _ in range(split.steps):
            x, _, w = next(it)
            x, w = x.numpy(), w.numpy()
            rows.extend(x[w > 0].tolist())
            pad.extend(w[w == 0].tolist())
        out.append((rows, pad))
    return out


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
    # Steps come from row counts over the whole world: the same on every rank, every row.
    assert shards[0].steps == shards[1].steps == -(-500 // 16)
    epochs = [_epochs(s, 3) for s in shards]
    for e in range(3):
        both = epochs[0][e][0] + epochs[1][e][0]
        assert sorted(both) == list(range(1000))  # every row once, on exactly one rank
        assert all(len(epochs[r][e][1]) == 32 * 16 - 500 for r in range(2))  # zero weights
    # Which rows go to which rank changes from epoch to epoch, and the order is shuffled.
    assert set(epochs[0][0][0]) != set(epochs[0][1][0])
    assert not np.all(np.diff(epochs[0][0][0]) > 0)


@pytest.mark.parametrize("shards", [2, 3, 8])
def test_a_table_of_one_row_group_trains_on_any_number_of_ranks(tmp_path, shards):
    snap = open_table(_write(str(tmp_path / "t"), n=100, rows_per_group=100))
    plan = plan_columns(snap, ("f",), "label")
    splits = [
        make_dataset(snap, plan, ReadOptions(8, training=True, shard=r, num_shards=shards))
        for r in range(shards)
    ]
    assert len({s.steps for s in splits}) == 1
    for e, per_rank in enumerate(zip(*[_epochs(s, 2) for s in splits])):
        rows = [r for rank_rows, _ in per_rank for r in rank_rows]
        assert sorted(rows) == list(range(100)), e
        sizes = [len(rank_rows) for rank_rows, _ in per_rank]
        assert max(sizes) - min(sizes) <= 1


def test_more_ranks_than_rows_says_how_to_fix(tmp_path):
    snap = open_table(_write(str(tmp_path / "t"), n=3, rows_per_group=3))
    plan = plan_columns(snap, ("f",), "label")
    with pytest.raises(DataError, match=r"3 live row\(s\) but 4 shards.*at most that many"):
        make_dataset(snap, plan, ReadOptions(batch_size=8, training=True, shard=0, num_shards=4))


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


def test_uneven_shards_run_equal_steps_and_split_the_rows_within_one(tmp_path):
    snap = open_table(_write(str(tmp_path / "t")))  # 10 row groups of 100 rows
    plan = plan_columns(snap, ("f",), "label")
    # One pass per rank: 334/333/333 rows, disjoint, covering every row.
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
    assert [len(p) for p in passes] == [334, 333, 333]
    assert sorted(np.concatenate(passes).tolist()) == list(range(1000))
    # Training: every rank runs the same steps of full batches (ceil(334 / 16)); together the
    # ranks train on every row once per epoch, the shorter ones padded with zero weights.
    splits = [
        make_dataset(snap, plan, ReadOptions(batch_size=16, training=True, shard=r, num_shards=3))
        for r in range(3)
    ]
    assert {s.steps for s in splits} == {21}
    assert [s.padded_rows for s in splits] == [21 * 16 - 334, 21 * 16 - 333, 21 * 16 - 333]
    for per_rank in zip(*[_epochs(s, 2) for s in splits]):
        assert sorted(r for rows, _ in per_rank for r in rows) == list(range(1000))


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
    snap = open_table(_write(str(tmp_path / "t")))  # 1000 rows: 31 batches of 32, then 8
    split = make_dataset(snap, plan_columns(snap, ("f",), "label"), ReadOptions(32, training=True))
    assert split.steps == 32 and split.padded_rows == 0 and not split.weighted
    batches = [x.numpy() for x, _ in split.dataset.take(3 * split.steps)]
    assert [len(b) for b in batches] == ([32] * 31 + [8]) * 3  # the last batch kept, partial
    epochs = [np.concatenate(batches[e * 32 : (e + 1) * 32]).tolist() for e in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(1000))
    assert epochs[0] != epochs[1] != epochs[2]  # a new seeded order every epoch


def test_validation_can_come_from_a_second_table(tmp_path):
    train = _write(str(tmp_path / "train"))
    val = _write(str(tmp_path / "val"), n=300)
    data = make_splits(DataConfig(table=train, features=("f", "v"), validation_table=val), 32)
    assert data.train.stats.rows == 1000 and data.validation.stats.rows == 300
    assert data.validation.steps == 10 and data.test is None
    rows = sum(int(y.shape[0]) for _, y in data.validation.dataset)
    assert rows == 300


def test_filters_that_empty_whole_row_groups_still_split_the_rows_evenly(tmp_path):
    # 10 row groups of 100 rows; the filter keeps rows of even row groups only. Shards are cut
    # by rows, so both ranks get 250 of them and run the same steps.
    path = _write(str(tmp_path / "t"), group=np.repeat(np.arange(10), 100))
    data = DataConfig(table=path, features=("f",), filters=("group in 0|2|4|6|8",))
    splits = [make_splits(data, batch_size=16, rank=r, world_size=2).train for r in range(2)]
    assert [s.rows for s in splits] == [250, 250] and {s.steps for s in splits} == {16}
    rows = [r for s in splits for r in _epochs(s, 1)[0][0]]
    assert sorted(rows) == sorted(i for i in range(1000) if (i // 100) % 2 == 0)


@pytest.mark.parametrize("batch", [1, 7, 32, 300])
def test_blocks_cut_any_chunk_sizes_into_whole_batches_in_order(batch):
    from keras_dl.data.stream.blocks import as_block as _as_block
    from keras_dl.data.stream.blocks import cut_blocks as _blocks

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
    if training:  # each epoch keeps its last partial batch: it never merges with the next
        assert sizes == ([24] * (1000 // 24) + [1000 % 24]) * 2
    else:
        assert sizes == [24] * (1000 // 24) + [1000 % 24]
        assert sorted(np.concatenate([f for f, _ in a]).tolist()) == list(range(1000))
