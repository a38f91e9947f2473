import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from keras_dl.data.sources import open_table, select
from keras_dl.errors import DataError


def _table(n=10, start=0):
    return pa.table({"x": np.arange(start, start + n, dtype=np.float32), "y": np.arange(n) % 2})


def test_delta_latest_and_time_travel(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _table(10))
    write_deltalake(path, _table(5, start=100), mode="append")
    latest = open_table(path)
    assert latest.format == "delta" and latest.version == 1 and len(latest.files) == 2
    v0 = open_table(path, version=0)
    assert v0.version == 0 and len(v0.files) == 1
    assert v0.lineage == {"data.table": path, "data.version": "0", "data.format": "delta"}


def test_delta_version_that_does_not_exist_names_the_range(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _table())
    with pytest.raises(DataError, match=r"has no version 7: its versions run from 0 to 0"):
        open_table(path, version=7)


def test_missing_table_says_how_to_create_it(tmp_path):
    with pytest.raises(DataError, match=r"does not exist.*keras-dl ingest"):
        open_table(str(tmp_path / "nope"))


def test_partition_filters_select_files(digits_table):
    snap = open_table(digits_table)
    assert snap.partition_columns == ("split",)
    train = select(snap, [("split", "=", "train")])
    assert 0 < len(train.files) < len(snap.files)
    assert all(p["split"] == "train" for p in train.partitions)
    assert train.row_filters == ()


def test_parquet_directory_and_file_list(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(_table(4), d / "a.parquet")
    pq.write_table(_table(6), d / "b.parquet")
    snap = open_table(str(d))
    assert snap.format == "parquet" and snap.version is None and len(snap.files) == 2
    listed = open_table(f"{d / 'a.parquet'},{d / 'b.parquet'}")
    assert len(listed.files) == 2
    with pytest.raises(DataError, match="time travel needs Delta|not a Delta table"):
        open_table(str(d), version=1)
