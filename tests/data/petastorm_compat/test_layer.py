"""Petastorm 0.13.1 through keras_dl's compatibility layer, on whichever pyarrow/numpy is installed.

Each read must return exactly the rows written: every pool type, a Spark-written Unischema
dataset (materialize_dataset), and Petastorm's own TF dataset. On pyarrow 12 / numpy 1.26 the
layer adds nothing and the same tests check Petastorm's own legacy path.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keras_dl.data import petastorm_compat
from keras_dl.data.petastorm_compat import parquet_dataset
from tests.conftest import PETASTORM_FILES

FILES, GROUPS, ROWS = PETASTORM_FILES  # per file: GROUPS row groups of ROWS rows
POOLS = ["thread", "process", "dummy"]


def _ids_written() -> list[int]:
    return list(range(FILES * GROUPS * ROWS))


def _batch_ids(urls, **kwargs) -> list[int]:
    from petastorm import make_batch_reader

    petastorm_compat.install()
    ids = []
    with make_batch_reader(urls, num_epochs=1, shuffle_row_groups=False, **kwargs) as reader:
        for batch in reader:
            ids += batch.id.tolist()
    return ids


@pytest.mark.parametrize("pool", POOLS)
def test_make_batch_reader_reads_files_in_the_order_given(petastorm_files, pool):
    urls = ["file://" + f for f in petastorm_files]
    # One worker keeps Petastorm's ventilation order: files as listed, row groups in order.
    assert _batch_ids(urls, reader_pool_type=pool, workers_count=1) == _ids_written()
    ids = _batch_ids(urls, reader_pool_type=pool, workers_count=2)
    assert sorted(ids) == _ids_written()


def test_shards_take_row_group_i_modulo_shard_count(petastorm_files):
    urls = ["file://" + f for f in petastorm_files]
    groups = [list(range(g * ROWS, (g + 1) * ROWS)) for g in range(FILES * GROUPS)]
    for shard in range(3):
        ids = _batch_ids(
            urls, reader_pool_type="dummy", workers_count=1, cur_shard=shard, shard_count=3
        )
        assert ids == [i for g in groups[shard::3] for i in g]


def test_parquet_dataset_pieces_and_partitions_match_the_legacy_layout(tmp_path):
    for part in ("b", "a"):
        os.makedirs(tmp_path / f"p={part}")
        table = pa.table({"id": [1, 2] if part == "a" else [3]})
        pq.write_table(table, tmp_path / f"p={part}" / "f.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    dataset = parquet_dataset.ParquetDataset(str(tmp_path), validate_schema=False)
    assert [os.path.relpath(p.path, tmp_path) for p in dataset.pieces] == [
        "p=a/f.parquet",
        "p=b/f.parquet",
    ]
    assert dataset.partitions.partition_names == {"p"} and dataset.partitions[0].keys == ["a", "b"]
    assert [p.partition_keys for p in dataset.pieces] == [[("p", 0)], [("p", 1)]]
    table = dataset.pieces[1].read(columns=["id"], partitions=dataset.partitions)
    assert table.column("id").to_pylist() == [3] and table.column("p").to_pylist() == ["b"]
    kept = parquet_dataset.ParquetDataset(str(tmp_path), filters=[("p", "=", "b")])
    assert [p.partition_keys for p in kept.pieces] == [[("p", 1)]]
    assert dataset.common_metadata is None and dataset.metadata is None


def test_local_files_open_to_read_as_arrow_files_and_to_write_as_python_files(tmp_path):
    # A Python file's bytes reach Arrow in buffers whose release needs the interpreter's lock:
    # a decode thread releasing one as the process exits aborted it (see LocalFileSystem).
    from keras_dl.data.petastorm_compat.filesystem import LocalFileSystem

    fs, path = LocalFileSystem.get_instance(), tmp_path / "t.parquet"
    with fs.open(path, "wb") as out:
        assert not isinstance(out, pa.NativeFile)
        pq.write_table(pa.table({"id": [1, 2]}), out)
    with fs.open(path) as f:
        assert isinstance(f, pa.NativeFile) and f.seekable()
        assert pq.ParquetFile(f).read().column("id").to_pylist() == [1, 2]
    with pytest.raises(FileNotFoundError):
        fs.open(tmp_path / "missing.parquet")
    piece = parquet_dataset.ParquetDatasetPiece(str(path), open_file_func=fs.open, row_group=0)
    assert piece.read().column("id").to_pylist() == [1, 2]


def test_make_batch_reader_prunes_hive_partitions_with_filters(tmp_path):
    for part, ids in (("a", [1, 2]), ("b", [3, 4, 5])):
        os.makedirs(tmp_path / f"p={part}")
        pq.write_table(pa.table({"id": ids}), tmp_path / f"p={part}" / "f.parquet")
    url = "file://" + str(tmp_path)
    assert sorted(_batch_ids(url, filters=[("p", "=", "b")], workers_count=1)) == [3, 4, 5]
    assert sorted(_batch_ids(url, workers_count=1)) == [1, 2, 3, 4, 5]


def test_numpy_names_petastorm_uses_are_there():
    from petastorm.predicates import in_intersection
    from petastorm.unischema import Unischema

    petastorm_compat.install()
    assert in_intersection([5], "x").do_include({"x": np.array([4, 5])})
    assert not in_intersection([7], "x").do_include({"x": np.array([4, 5])})
    schema = Unischema.from_arrow_schema(
        parquet_dataset.ParquetDataset([_string_file()], validate_schema=False)
    )
    assert schema.fields["s"].numpy_dtype is np.str_


# (field values, inclusion values, what numpy 1.26 + pyarrow 12 answered: measured on the old pin)
_FLOAT_PREDICATES = [
    (np.array([0.1], np.float32), [0.1], True),
    (np.array([0.1], np.float32), [np.float32(0.1)], True),
    (np.array([0.1], np.float64), [np.float32(0.1)], False),
    (np.array([0.1], np.float32), [0.1] + [float(i) for i in range(20)], False),
    (np.array([0.1, 0.2, 0.3], np.float32), [0.3], True),
    (np.array([16777216], np.float32), [16777217], False),
    (np.array([np.inf], np.float32), [1e300], False),
    (np.array([1.0], np.float16), [1.0000001], True),
    (np.array([0.1], np.float32), [np.float64(0.1), np.float32(0.2)], True),
    (np.array([3], np.int8), [3.0], True),
    (np.array([0.5], np.float32), [0.5], True),
]


@pytest.mark.parametrize("values,inclusion,expected", _FLOAT_PREDICATES)
def test_in_intersection_matches_floats_as_numpy_1_did(values, inclusion, expected):
    """numpy 2's NEP 50 promotion made float32 0.1 stop matching 0.1 in Petastorm's predicate."""
    from petastorm.predicates import in_intersection

    petastorm_compat.install()
    assert in_intersection(inclusion, "x").do_include({"x": values}) is expected


def _string_file() -> str:
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "s.parquet")
    pq.write_table(pa.table({"s": ["a", "b"]}), path)
    return path


@pytest.mark.slow
def test_make_petastorm_dataset_feeds_tf_every_row(petastorm_files):
    import tensorflow as tf
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset

    petastorm_compat.install()
    urls = ["file://" + f for f in petastorm_files]
    ids, names = [], []
    with make_batch_reader(urls, num_epochs=1, workers_count=1, shuffle_row_groups=False) as r:
        for batch in make_petastorm_dataset(r):
            ids += batch.id.numpy().tolist()
            names += [n.decode() for n in batch.name.numpy()]
            assert batch.x.dtype == tf.float64
    assert ids == _ids_written() and names == [f"n{i}" for i in ids]


@pytest.fixture(scope="module")
def unischema_dataset(spark, tmp_path_factory) -> str:
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import LongType, StringType

    petastorm_compat.install()
    schema = Unischema(
        "Compat",
        [
            UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("name", np.str_, (), ScalarCodec(StringType()), False),
            UnischemaField("vec", np.float32, (3,), NdarrayCodec(), False),
        ],
    )
    url = "file://" + str(tmp_path_factory.mktemp("unischema") / "ds")
    with materialize_dataset(spark, url, schema, row_group_size_mb=1):
        rows = [
            dict_to_spark_row(schema, {"id": i, "name": f"n{i}", "vec": np.full(3, i, np.float32)})
            for i in range(60)
        ]
        spark.createDataFrame(rows, schema.as_spark_schema()).repartition(3).write.parquet(url)
    return url


@pytest.mark.slow
def test_materialize_dataset_writes_the_unischema_metadata(unischema_dataset):
    from petastorm.etl.dataset_metadata import get_schema_from_dataset_url

    assert os.path.exists(unischema_dataset[len("file://") :] + "/_common_metadata")
    schema = get_schema_from_dataset_url(unischema_dataset)
    assert list(schema.fields) == ["id", "name", "vec"]


@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
def test_make_reader_reads_every_row_once(unischema_dataset, pool):
    from petastorm import make_reader

    seen = []
    with make_reader(unischema_dataset, num_epochs=1, reader_pool_type=pool, workers_count=2) as r:
        for row in r:
            assert row.name == f"n{row.id}"
            np.testing.assert_array_equal(row.vec, np.full(3, row.id, np.float32))
            seen.append(int(row.id))
    assert sorted(seen) == list(range(60))
