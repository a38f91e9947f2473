"""Sample weights (``data.weight_column``) and class weights (``train.class_weight``) on real
Delta tables: what ``model.fit`` receives over an epoch, as a property (Hypothesis), and the
errors for bad weights and bad class-weight settings."""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.config import DataConfig, Experiment, resolve
from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns
from keras_dl.data.splits import make_splits
from keras_dl.errors import ConfigError, DataError
from tests.fixtures.delta_protocol import write_protocol_table

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def weight_of(ids: np.ndarray) -> np.ndarray:
    """The weight column's value of each row: 0 to 3 in steps of 0.5 (zero included)."""
    return (ids % 7).astype(np.float64) * 0.5


def label_of(ids: np.ndarray) -> np.ndarray:
    return (ids // 3) % 3


def write_weighted(root, files, deleted, weights=weight_of) -> tuple[str, Counter]:
    """A Delta table of ``id``, ``label``, ``w`` with ``files`` (row groups per file) and
    deletion vectors; returns its path and the live ids."""
    path = str(root / f"w-{uuid.uuid4().hex[:8]}")
    ids = itertools.count()
    tables, live = [], Counter()
    for groups, gone in zip(files, deleted):
        start, row, parts = next(ids) * 1000, 0, []
        for n in groups:
            values = np.arange(start + row, start + row + n, dtype=np.int64)
            parts.append(pa.table({"id": values, "label": label_of(values), "w": weights(values)}))
            row += n
        tables.append(parts)
        live.update(start + r for r in set(range(row)) - set(gone))
    write_protocol_table(path, tables, deleted)
    return path, live


@st.composite
def layouts(draw):
    files = draw(
        st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3), min_size=1, max_size=3)
    )
    deleted = [
        draw(st.lists(st.integers(0, sum(g) - 1), unique=True, max_size=sum(g) // 2)) for g in files
    ]
    return files, deleted


@pytest.mark.slow  # 15 examples: 24-44 s on 2 shared cores
@settings(max_examples=15, **SETTINGS)
@given(
    layout=layouts(),
    shards=st.integers(1, 3),
    batch=st.integers(1, 6),
    shuffle=st.booleans(),
    cache=st.sampled_from([0, 1 << 20]),
    class_weights=st.sampled_from([(), ((0, 2.0), (2, 0.25))]),
    use_column=st.booleans(),
)
def test_fit_receives_each_live_row_once_with_its_weight_and_padding_weighs_zero(
    tmp_path, layout, shards, batch, shuffle, cache, class_weights, use_column
):
    if not use_column and not class_weights:
        use_column = True
    path, live = write_weighted(tmp_path, *layout)
    if sum(live.values()) < shards:
        return  # refused with a clear error (tested in test_tfdata)
    snap = open_table(path)
    plan = plan_columns(snap, ["id"], "label", weight="w" if use_column else None)
    assert plan.columns == ["id", "label"] + (["w"] if use_column else [])
    plan = dataclasses.replace(plan, class_weights=class_weights)
    factor = dict(class_weights)
    for epoch in range(2):
        seen, padding = Counter(), []
        for rank in range(shards):
            split = make_dataset(
                snap,
                plan,
                ReadOptions(
                    batch,
                    training=True,
                    shard=rank,
                    num_shards=shards,
                    shuffle=shuffle,
                    shuffle_buffer=5,
                    cache_max_bytes=cache,
                ),
            )
            assert split.weighted
            rows = []
            for features, labels, weights in split.dataset.take(split.steps * (epoch + 1)):
                rows += zip(features.numpy(), labels.numpy(), weights.numpy())
            epoch_rows = rows[-(split.rows + split.padded_rows) :]
            live_rows, pad = epoch_rows[: split.rows], epoch_rows[split.rows :]
            padding += [w for _, _, w in pad]
            for i, label, w in live_rows:
                expected = weight_of(np.array([i]))[0] if use_column else 1.0
                expected *= factor.get(int(label_of(np.array([i]))[0]), 1.0)
                assert label == label_of(np.array([i]))[0]
                assert w == pytest.approx(expected), (i, w, expected)
                seen[int(i)] += 1
        assert seen == live, epoch  # every live row once per epoch, across the shards
        assert all(w == 0 for w in padding)  # padding moves no gradient and no metric


def test_evaluation_splits_carry_the_weight_column_but_not_class_weights(tmp_path):
    path, live = write_weighted(tmp_path, [[6, 5]], [[1]])
    data = DataConfig(table=path, label="label", features=("id",), weight_column="w")
    splits = make_splits(data, 4, class_weight=("0:3",))
    assert splits.plan.columns == ["id", "label", "w"]
    assert [f.name for f in splits.plan.features] == ["id"]  # never a model input
    assert splits.plan.class_weights == ((0, 3.0),)
    plan = dataclasses.replace(splits.plan, class_weights=())  # as make_splits' evaluation
    evaluate = make_dataset(splits.snapshot, plan, ReadOptions(4))
    got = {}
    for features, _, weights in evaluate.dataset:
        got.update(zip(features.numpy().tolist(), weights.numpy().tolist()))
    assert got == {i: weight_of(np.array([i]))[0] for i in live}


def test_balanced_class_weights_come_from_the_training_split_s_label_counts(tmp_path):
    path, live = write_weighted(tmp_path, [[9, 9], [6]], [[], [0, 1]])
    labels = Counter(int(label_of(np.array([i]))[0]) for i in live)
    data = DataConfig(table=path, label="label", features=("id",))
    splits = make_splits(data, 4, class_weight=("balanced",))
    n = sum(labels.values())
    assert dict(splits.plan.class_weights) == pytest.approx(
        {c: n / (len(labels) * k) for c, k in labels.items()}
    )


@pytest.mark.parametrize(
    "values, what",
    [
        (lambda ids: np.where(ids == 3, np.nan, 1.0), "NaN or infinite"),
        (lambda ids: np.where(ids == 3, -0.5, 1.0), "negative"),
        (lambda ids: pa.array([None if i == 3 else 1.0 for i in ids], pa.float64()), "null"),
    ],
)
def test_a_bad_weight_is_a_data_error_naming_table_file_and_column(tmp_path, values, what):
    path, _ = write_weighted(tmp_path, [[4, 4]], [[]], weights=values)
    data = DataConfig(table=path, label="label", features=("id",), weight_column="w")
    with pytest.raises(DataError, match=what) as raised:
        splits = make_splits(data, 4)
        for _ in splits.train.batches():
            pass
    text = str(raised.value)
    assert "'w'" in text and ".parquet" in text and path.split("/")[-1] in text


def test_a_bad_weight_behind_a_deletion_vector_is_named_by_file(tmp_path, capfd):
    # A file with deleted rows is checked as it is read (its footer may count deleted nulls).
    path, _ = write_weighted(tmp_path, [[4, 4]], [[0]], weights=lambda i: np.where(i == 5, -1, 1.0))
    data = DataConfig(table=path, label="label", features=("id",), weight_column="w")
    splits = make_splits(data, 4)
    with pytest.raises(DataError, match=r"'w' \(data.weight_column\).*\.parquet.*row group 1"):
        for _ in splits.train.batches():
            pass
    # The rows are checked on the reader's worker threads, which hand the error over in the
    # order of the reads: no worker prints a traceback of its own.
    err = capfd.readouterr().err
    assert "Traceback" not in err and "terminated" not in err, err


def test_a_non_numeric_or_missing_weight_column_is_named(tmp_path):
    path, _ = write_weighted(tmp_path, [[4]], [[]], weights=lambda ids: [str(i) for i in ids])
    with pytest.raises(DataError, match=r"Column 'w' of table .* sample weight"):
        make_splits(DataConfig(table=path, features=("id",), weight_column="w"), 4)
    with pytest.raises(DataError, match=r"'nope' named in data.weight_column"):
        make_splits(DataConfig(table=path, features=("id",), weight_column="nope"), 4)


def test_class_weight_keys_and_modes_are_config_errors_naming_them(tmp_path):
    path, _ = write_weighted(tmp_path, [[9]], [[]])
    data = DataConfig(table=path, label="label", features=("id",))
    with pytest.raises(ConfigError, match=r"'7'.*not a label of column 'label'"):
        make_splits(data, 4, class_weight=("0:1", "7:2"))
    for bad in ("balancd", "0:x", "1:-2"):
        with pytest.raises(ConfigError, match=rf"train.class_weight entry '{bad}'"):
            resolve(Experiment(data=data), sets=[f"train.class_weight={bad}"])
    exp = resolve(Experiment(data=data), sets=["train.class_weight=0:1,2:0.5"])
    assert exp.train.class_weight == ("0:1", "2:0.5")


@pytest.mark.parametrize("cache", [0, 1 << 20])
def test_weights_ride_past_a_preprocess_hook_run_in_tf_data_or_cached(tmp_path, cache):
    import tensorflow as tf

    def hook(features, label):
        return tf.cast(features, tf.float32) * 2.0, label

    hook.deterministic = True  # with the memory cache on, it runs in the generator, once per row
    path, live = write_weighted(tmp_path, [[5, 4], [6]], [[2], []])
    snap = open_table(path)
    plan = plan_columns(snap, ["id"], "label", weight="w")
    split = make_dataset(snap, plan, ReadOptions(4, cache_max_bytes=cache), hook)
    got = {}
    for _ in range(2):  # the second pass replays the cache when it is on
        for features, _, weights in split.dataset:
            got.update(zip((features.numpy() / 2).astype(int).tolist(), weights.numpy().tolist()))
        assert got == {i: weight_of(np.array([i]))[0] for i in live}


def test_balanced_class_weights_of_a_run_on_what_changed_count_only_the_changed_rows(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "grows")
    write_deltalake(path, pa.table({"id": list(range(8)), "label": [0] * 6 + [1] * 2}))
    write_deltalake(path, pa.table({"id": [8, 9, 10], "label": [1, 1, 2]}), mode="append")
    data = DataConfig(table=path, label="label", features=("id",), since_version=0)
    splits = make_splits(data, 2, class_weight=("balanced",))
    # Version 1's rows only: two of label 1, one of label 2 (label 0 is not in the range).
    assert dict(splits.plan.class_weights) == pytest.approx({1: 3 / (2 * 2), 2: 3 / (2 * 1)})
    with pytest.raises(ConfigError, match=r"'0'.*not a label.*its labels: 1, 2"):
        make_splits(data, 2, class_weight=("0:2",))
