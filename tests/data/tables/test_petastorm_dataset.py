"""Existing Petastorm datasets (Unischema + codecs, materialize_dataset) read with make_reader."""

import numpy as np
import pytest

from keras_dl.config import DataConfig
from keras_dl.data import make_splits, open_table, plan_columns

# On the classic session only (no connect_too): Petastorm's own materialize_dataset writes the
# fixture through a SparkContext.
pytestmark = pytest.mark.slow


def _image(i: int) -> np.ndarray:
    img = np.zeros((8, 8, 3), dtype=np.uint8)
    img[..., 0] = i
    img[i % 8, :, 1] = 255
    return img


@pytest.fixture(scope="module")
def petastorm_dataset(spark, tmp_path_factory):
    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import LongType

    schema = Unischema(
        "Legacy",
        [
            UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False),
            UnischemaField("vec", np.float32, (4,), NdarrayCodec(), False),
            UnischemaField("label", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("a", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("b", np.int64, (), ScalarCodec(LongType()), False),
        ],
    )
    url = "file://" + str(tmp_path_factory.mktemp("petastorm") / "legacy")
    with materialize_dataset(spark, url, schema, row_group_size_mb=1):
        rows = [
            dict_to_spark_row(
                schema,
                {
                    "image": _image(i),
                    "vec": np.full(4, i, np.float32),
                    "label": i % 3,
                    "a": i,
                    "b": -2 * i,
                },
            )
            for i in range(40)
        ]
        df = spark.createDataFrame(rows, schema.as_spark_schema()).repartition(4)
        df.write.mode("overwrite").parquet(url)
    return url[len("file://") :]


def test_unischema_dataset_is_read_with_its_codecs_without_rewriting(petastorm_dataset):
    snap = open_table(petastorm_dataset)
    assert snap.format == "petastorm" and len(snap.files) == 4
    plan = plan_columns(snap, ("image", "vec"), "label")
    assert [(f.name, f.dtype, f.shape) for f in plan.features] == [
        ("image", "uint8", (8, 8, 3)),
        ("vec", "float32", (4,)),
    ]
    data = make_splits(
        DataConfig(table=petastorm_dataset, features=("image", "vec"), shuffle=False),
        batch_size=8,
    )
    assert data.train.stats.rows == 40 and data.train.steps == 5
    seen = []
    for x, y in data.train.dataset.take(data.train.steps):
        assert x["image"].shape == (8, 8, 8, 3) and x["image"].dtype.name == "uint8"
        for img, vec, label in zip(x["image"].numpy(), x["vec"].numpy(), y.numpy()):
            i = int(vec[0])
            np.testing.assert_array_equal(img, _image(i))
            assert label == i % 3
            seen.append(i)
    assert sorted(seen) == list(range(40))


def test_unischema_dataset_shards_by_row_group(petastorm_dataset):
    from keras_dl.data import ReadOptions, make_dataset

    snap = open_table(petastorm_dataset)
    plan = plan_columns(snap, ("vec",), "label")
    parts = []
    for rank in range(2):
        split = make_dataset(snap, plan, ReadOptions(batch_size=4, shard=rank, num_shards=2))
        parts.append({int(v[0]) for x, _ in split.dataset for v in x.numpy()})
    assert not parts[0] & parts[1] and parts[0] | parts[1] == set(range(40))


def test_unischema_scalar_fields_of_one_dtype_pack(petastorm_dataset):
    from keras_dl.data import ReadOptions, make_dataset

    snap = open_table(petastorm_dataset)
    plan = plan_columns(snap, ("b", "vec", "a"), "label", pack=True)
    assert [(f.name, f.shape, f.members) for f in plan.features] == [
        ("__packed_int64", (2,), ("b", "a")),
        ("vec", (4,), ()),
    ]
    seen = []
    for x, y in make_dataset(snap, plan, ReadOptions(batch_size=8)).dataset:
        packed, i = x["__packed_int64"].numpy(), x["vec"].numpy()[:, 0].astype(np.int64)
        assert packed.dtype == np.int64
        np.testing.assert_array_equal(packed, np.stack([-2 * i, i], 1))  # rows whole
        np.testing.assert_array_equal(y.numpy(), i % 3)
        seen.extend(i.tolist())
    assert sorted(seen) == list(range(40))


def test_unischema_dataset_refuses_a_mid_epoch_resume_on_other_ranks_by_name(petastorm_dataset):
    from keras_dl.data import ReadOptions, make_dataset
    from keras_dl.data.stream.epoch_position import EpochPosition, Segment
    from keras_dl.errors import ConfigError

    snap = open_table(petastorm_dataset)
    plan = plan_columns(snap, ("vec",), "label")
    split = make_dataset(snap, plan, ReadOptions(batch_size=4, training=True))
    with pytest.raises(ConfigError, match=r"on 2 rank\(s\) of 2 rows.*runtime.np"):
        split.resume_from(EpochPosition(0, (Segment(2, 2, 3),)))
    split.resume_from(EpochPosition(0, (Segment(1, 4, 3),)))  # the same ranks: continues
