"""Spark DataFrames through the converter, on a real local SparkSession."""

import os
import shutil

import numpy as np
import pytest

from keras_dl.config import DataConfig
from keras_dl.data import make_splits
from keras_dl.data.spark_converter import make_spark_converter
from keras_dl.errors import DataError

pytestmark = pytest.mark.slow


def _frame(spark, n=60):
    rows = [(i, float(i) / 2, [float(i)] * 3, f"r{i}", i % 3) for i in range(n)]
    return spark.createDataFrame(rows, "id long, x double, v array<double>, name string, label int")


@pytest.mark.connect_too
def test_dataframe_is_materialized_once_with_two_partitions_per_worker(spark, tmp_path):
    cache = str(tmp_path / "cache")
    df = _frame(spark).coalesce(1)
    conv = make_spark_converter(df, cache_dir=cache, workers=3)
    try:
        assert conv.rows == 60 and conv.partitions == 6
        snap = conv.open()
        assert len(snap.files) == 6
        assert str(snap.schema.field("x").type) == "float" and "float" in str(
            snap.schema.field("v").type
        )
        # The same DataFrame again: same folder, nothing rewritten.
        mtimes = sorted(os.path.getmtime(f) for f in snap.files)
        again = make_spark_converter(df, cache_dir=cache, workers=3)
        assert again is conv and len(os.listdir(cache)) == 1
        assert sorted(os.path.getmtime(f) for f in conv.open().files) == mtimes
        # A different query is a different folder.
        other = make_spark_converter(df.filter("id < 30"), cache_dir=cache, workers=3)
        assert other.path != conv.path and other.rows == 30
        other.delete()
        data = make_splits(
            DataConfig(table=conv.path, features=("x", "v"), shuffle=False), batch_size=8
        )
        xs = []
        for x, _ in data.train.dataset.take(data.train.steps):
            assert x["v"].shape[1:] == (3,) and x["x"].dtype.name == "float32"
            np.testing.assert_allclose(x["v"].numpy()[:, 0], 2 * x["x"].numpy())
            xs.append(x["x"].numpy())
        every = np.concatenate(xs)  # the 60 rows, the last batch of 4 kept
        assert len(every) == len(np.unique(every)) == data.train.stats.rows == 60
    finally:
        conv.delete()
    assert not os.path.exists(conv.path)
    with pytest.raises(DataError, match="was deleted"):
        conv.open()


def test_context_manager_deletes_and_a_new_conversion_rewrites(spark, tmp_path):
    df = _frame(spark, 20)
    with make_spark_converter(df, cache_dir=str(tmp_path), workers=1) as conv:
        assert os.path.isdir(conv.path) and conv.partitions >= 2
    assert not os.path.exists(conv.path)
    with make_spark_converter(df, cache_dir=str(tmp_path), workers=1) as fresh:
        assert fresh is not conv and os.path.isdir(fresh.path)


@pytest.mark.connect_too
def test_vector_and_struct_columns_are_refused_with_the_fix(spark, tmp_path):
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(Vectors.dense([1.0, 2.0]), 1)], ["features", "label"])
    with pytest.raises(DataError, match=r"'features' is a vector.*vector_to_array"):
        make_spark_converter(df, cache_dir=str(tmp_path))
    nested = _frame(spark, 4).select(F.struct("x", "id").alias("s"), "label")
    with pytest.raises(DataError, match=r"'s' is a struct.*col\('s.<field>'\)"):
        make_spark_converter(nested, cache_dir=str(tmp_path))
    assert not os.listdir(tmp_path)  # nothing written


def test_persistent_delta_tables_are_named_by_their_rows_and_kept(spark, tmp_path):
    import atexit

    cache = str(tmp_path / "store")
    with pytest.raises(DataError, match="persistent=True needs table_format='delta'"):
        make_spark_converter(_frame(spark, 10), cache_dir=cache, persistent=True)
    opts = dict(cache_dir=cache, workers=1, table_format="delta", persistent=True)
    exit_hooks = atexit._ncallbacks()
    df = _frame(spark, 20)
    conv = make_spark_converter(df, **opts)
    assert atexit._ncallbacks() == exit_hooks  # kept at exit: a later process reuses it
    snap = conv.open()
    assert conv.rows == 20 and snap.version == 0 and len(snap.files) == conv.partitions >= 2
    mtimes = {f: os.path.getmtime(f) for f in snap.files}
    # Another query plan (another partitioning, another order) with the same rows.
    again = make_spark_converter(_frame(spark, 20).repartition(3).orderBy("x"), **opts)
    assert again is not conv and again.path == conv.path and again.rows == 20
    assert {f: os.path.getmtime(f) for f in again.open().files} == mtimes
    assert os.listdir(os.path.join(conv.path, "_delta_log")) == ["00000000000000000000.json"]
    other = make_spark_converter(_frame(spark, 21), **opts)
    assert other.path != conv.path and other.rows == 21
    with pytest.raises(DataError, match="no rows"):
        make_spark_converter(_frame(spark, 20).filter("id < 0"), **opts)
    assert sorted(os.listdir(cache)) == sorted({os.path.basename(p) for p in (conv.path, other.path)})  # fmt: skip
    shutil.rmtree(conv.path)  # removed behind the converter's back: the same plan writes it again
    rewritten = make_spark_converter(df, **opts)
    assert rewritten.path == conv.path and rewritten.open().version == 0


@pytest.mark.parametrize("table_format", ["parquet", "delta"])
def test_the_converter_writes_page_checksums_that_the_reader_verifies(
    spark, tmp_path, table_format
):
    import pyarrow.parquet as pq

    from keras_dl.data import open_table, read_table

    df = spark.range(4000).selectExpr("id * 1.25 AS x", "CAST(id % 3 AS INT) AS label")
    conv = make_spark_converter(df, cache_dir=str(tmp_path), workers=1, table_format=table_format)
    victim = open_table(conv.path).files[0]
    chunk = pq.ParquetFile(victim).metadata.row_group(0).column(0)
    start = chunk.data_page_offset
    if chunk.has_dictionary_page:
        start = min(start, chunk.dictionary_page_offset)
    at = start + chunk.total_compressed_size // 2  # inside a page of x, past its header
    with open(victim, "r+b") as f:
        f.seek(at)
        f.write(b"\0" * 16)

    with pytest.raises(DataError) as err:
        read_table(conv.path)

    message = str(err.value)
    assert f"file {victim!r}, row group 0," in message
    assert "CRC checksum verification failed" in message
    conv.delete()


@pytest.mark.connect_too
def test_write_delta_reports_the_version_it_committed_after_another_writers_commit(
    spark, tmp_path, monkeypatch
):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from keras_dl.data.ingest.spark_delta import write_delta

    to = str(tmp_path / "t")
    df = spark.createDataFrame([(i,) for i in range(4)], "id long")
    assert write_delta(df, to).version == 0
    own_commit = DeltaTable.create_write_transaction

    def another_writer_commits_first(self, *args, **kwargs):
        # A real commit (version 1) after this write read the table, before it commits.
        write_deltalake(to, pa.table({"id": pa.array([99], pa.int64())}), mode="append")
        return own_commit(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", another_writer_commits_first)
    report = write_delta(df, to, mode="append")
    assert report.version == 2 == DeltaTable(to).version() and report.rows == 4


def test_the_same_rows_written_twice_read_back_in_the_same_order(spark, tmp_path):
    """Files are named by partition first: the snapshot (files in path order) reads a
    DataFrame's rows in its partitions' order on every write, so a model trained on it twice
    sees the same order (random file names alone reordered them on each write)."""
    from keras_dl.data import open_table, read_table
    from keras_dl.data.ingest.spark_delta import write_delta

    df = spark.createDataFrame([(i,) for i in range(60)], "id long").repartition(6, "id")
    expected = [r.id for r in df.collect()]  # partition by partition, in partition order
    for name in ("a", "b"):
        write_delta(df, str(tmp_path / name))
        assert read_table(str(tmp_path / name))["id"].to_pylist() == expected
    names = [f.rsplit("/", 1)[-1] for f in open_table(str(tmp_path / "a")).files]
    assert [n[:15] for n in names] == [f"part-{p:05d}-0000" for p in range(6)], names
