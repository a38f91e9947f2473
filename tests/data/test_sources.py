import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from keras_dl.data import open_table, select
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


def test_delta_time_travel_by_timestamp(tmp_path):
    import time
    from datetime import datetime, timezone

    path = str(tmp_path / "t")
    write_deltalake(path, _table(10))
    time.sleep(1.2)
    between = datetime.now(timezone.utc).isoformat()
    time.sleep(1.2)
    write_deltalake(path, _table(5, start=100), mode="append")
    snap = open_table(path, timestamp=between)
    assert snap.version == 0 and len(snap.files) == 1
    last = DeltaTable(path).history(1)[0]["timestamp"]  # ms, the commit's own time
    at_last = datetime.fromtimestamp(last / 1000, timezone.utc).isoformat()
    assert open_table(path, timestamp=at_last).version == 1
    with pytest.raises(DataError, match=r"after its last commit \(version 1, committed at "):
        open_table(path, timestamp="2999-01-01T00:00:00+00:00")  # as Delta Spark refuses it
    with pytest.raises(DataError, match="no version at or before"):
        open_table(path, timestamp="2000-01-01T00:00:00+00:00")
    with pytest.raises(DataError, match="not an ISO 8601"):
        open_table(path, timestamp="yesterday")


def test_parquet_glob_matches_files_recursively(tmp_path):
    for sub, n in (("a", 3), ("b", 4)):
        (tmp_path / sub).mkdir()
        pq.write_table(_table(n), tmp_path / sub / "part.parquet")
    (tmp_path / "b" / "notes.txt").write_text("x")
    snap = open_table(str(tmp_path / "**" / "*.parquet"))
    assert snap.format == "parquet" and len(snap.files) == 2
    with pytest.raises(DataError, match="matches no file"):
        open_table(str(tmp_path / "*.csv"))


def _partitioned(path):
    n = 40
    table = pa.table(
        {
            "x": np.arange(n, dtype=np.float32),
            "year": np.repeat([2019, 2020, 2021, 2022], 10).astype(np.int32),
            "country": np.tile(["US", "FR", "DE", "US"], 10),
            "label": np.arange(n) % 2,
        }
    )
    write_deltalake(path, table, partition_by=["year"])
    return path


def test_typed_partition_filters_and_row_filters_from_config(tmp_path):
    from keras_dl.config import DataConfig
    from keras_dl.data import make_splits

    path = _partitioned(str(tmp_path / "t"))
    snap = open_table(path)
    assert snap.partition_columns == ("year",) and len(snap.files) == 4
    # Numeric comparison on the partition strings: "2021" >= 2020 and "2019" < 2020.
    assert len(select(snap, [("year", ">=", 2020)]).files) == 3
    assert len(select(snap, [("year", "in", ["2019", "2022"])]).files) == 2
    data = make_splits(
        DataConfig(
            table=path,
            features=("x",),
            filters=("year >= 2020", "country in US|DE"),
            shuffle=False,
        ),
        batch_size=4,
    )
    assert len(data.snapshot.files) == 3 and data.train.stats.rows == 23
    xs = np.concatenate([x.numpy() for x, _ in data.train.dataset.take(data.train.steps)])
    assert set(xs.tolist()) <= {float(i) for i in range(10, 40) if i % 4 != 1}
    assert len(xs) == len(set(xs.tolist())) == 23  # every row: 5 batches of 4, then one of 3


def test_bad_filter_text_names_the_problem(tmp_path):
    from keras_dl.data.tables.filters import parse_filter

    schema = pa.schema([("year", pa.int32()), ("c", pa.string())])
    assert parse_filter("c not in a|b", schema) == ("c", "not in", ["a", "b"])
    with pytest.raises(DataError, match="not 'COLUMN OP VALUE'"):
        parse_filter("year", schema)
    with pytest.raises(DataError, match="'month' is not in the table"):
        parse_filter("month = 3", schema)
    with pytest.raises(DataError, match="not a int32 value"):
        parse_filter("year > soon", schema)


def test_local_disk_cache_copies_once_and_keeps_lineage(tmp_path):
    from keras_dl.config import DataConfig
    from keras_dl.data import make_splits

    path = _partitioned(str(tmp_path / "t"))
    cache = tmp_path / "cache"
    data = make_splits(
        DataConfig(
            table=path,
            features=("x",),
            cache_dir=str(cache),
            split_column="year",
            train_split="2020",
            validation_split="2021",
            test_split="",
        ),
        batch_size=5,
    )
    assert data.snapshot.local_copies.wait(timeout=60)  # copied while the first epoch streams
    assert all(f.startswith(str(cache)) for f in data.snapshot.with_local_copies().files)
    assert data.snapshot.lineage["data.table"] == path
    assert data.train.stats.rows == 10 and data.validation.stats.rows == 10
    copied = sorted((cache / "entries").iterdir())
    assert len(copied) == 4
    inodes = [f.stat().st_ino for f in copied]
    again = make_splits(DataConfig(table=path, features=("x",), cache_dir=str(cache)), batch_size=5)
    assert all(f.startswith(str(cache)) for f in again.snapshot.files)  # at once: nothing to copy
    assert again.snapshot.local_copies is None
    assert [f.stat().st_ino for f in sorted((cache / "entries").iterdir())] == inodes  # kept
