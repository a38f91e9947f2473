"""`write_table` (every ingest) writes Parquet page checksums and still writes the Delta table
delta-rs' ``write_deltalake`` wrote: schema, partition folders and values, row groups, stats."""

from __future__ import annotations

import json
import os
import shutil
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.data import open_table, read_table
from keras_dl.data.ingest.datasets import ingest_sklearn_digits, write_table
from keras_dl.errors import DataError
from keras_dl.storage import delta_row_group_options, delta_storage_options
from tests.data.tables.test_partition_values import WRITTEN, _kernel, _same


def _files(path: str) -> list[str]:
    return list(open_table(path).files)


def _checksummed(file: str, tmp) -> bool:
    """Whether flipping the last byte of row group 0's first column fails its page checksum."""
    copy = str(tmp / f"copy-{os.path.basename(file)}")
    shutil.copyfile(file, copy)
    column = pq.ParquetFile(copy).metadata.row_group(0).column(0)
    start = column.data_page_offset
    if column.has_dictionary_page:
        start = min(start, column.dictionary_page_offset)
    with open(copy, "r+b") as f:
        f.seek(start + column.total_compressed_size - 1)  # inside the last page's values
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([last ^ 0xFF]))
    try:
        pq.ParquetFile(copy, page_checksum_verification=True).read_row_group(0)
    except OSError as exc:
        return "CRC checksum verification failed" in str(exc)
    finally:
        os.remove(copy)
    return False


def _groups(file: str) -> list[int]:
    md = pq.ParquetFile(file).metadata
    return [md.row_group(g).num_rows for g in range(md.num_row_groups)]


def test_zeroed_bytes_in_an_ingested_page_stop_the_read_naming_file_and_row_group(tmp_path):
    to = str(tmp_path / "t")
    x = np.random.default_rng(0).random(6000)  # unique floats: 16 KB of values per group
    write_table(pa.table({"x": x, "label": np.arange(6000) % 3}), to, rows_per_group=2000)
    (file,) = _files(to)
    column = pq.ParquetFile(file).metadata.row_group(2).column(0)
    start = column.data_page_offset
    if column.has_dictionary_page:
        start = min(start, column.dictionary_page_offset)
    with open(file, "r+b") as f:
        f.seek(start + column.total_compressed_size // 2)
        f.write(b"\0" * 16)  # inside a page, past its header

    with pytest.raises(DataError) as err:
        read_table(to, columns=["x", "label"])

    message = str(err.value)
    assert f"file {file!r}, row group 2," in message
    assert "CRC checksum verification failed" in message


def test_partitioned_ingest_round_trips_in_hive_folders_with_delta_partition_values(tmp_path):
    to = str(tmp_path / "t")
    n = 50
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "x": pa.array(np.arange(n) * 0.5, pa.float32()),
            "s": pa.array([["a b/=%", "日本", "\x00", "", None][i % 5] for i in range(n)]),
            "k": pa.array([i % 2 for i in range(n)], pa.uint8()),
        }
    )
    report = write_table(table, to, partition_by=["s", "k"], rows_per_group=3)

    assert report.rows == n and report.files == 10 and report.version == 0
    assert read_table(to).sort_by("id").select(["id", "x", "s", "k"]).to_pylist() == (
        table.cast(table.schema.set(3, pa.field("k", pa.int8()))).to_pylist()
    )
    query = QueryBuilder().register("t", DeltaTable(to))
    theirs = query.execute("select id, s, k from t order by id").read_all()
    assert theirs.column("s").to_pylist() == table.column("s").to_pylist()
    with open(os.path.join(to, "_delta_log", "00000000000000000000.json")) as log:
        adds = [a["add"] for a in map(json.loads, log) if "add" in a]
    assert {(a["partitionValues"]["s"], a["partitionValues"]["k"]) for a in adds} == {
        (s, k) for s in ("a b/=%", "日本", "\x00", "", None) for k in ("0", "1")
    }
    for add in adds:
        file = os.path.join(to, unquote(add["path"]))
        folder = os.path.relpath(os.path.dirname(file), to)
        assert folder.startswith("s=") and "/k=" in folder
        if add["partitionValues"]["s"] is None:
            assert folder.startswith("s=__HIVE_DEFAULT_PARTITION__/")
        assert set(pq.read_schema(file).names) == {"id", "x"}  # partition columns: folders only
        assert _groups(file) == [3, 2] and _checksummed(file, tmp_path)


def _stats(path: str) -> dict:
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    (add,) = adds
    return {
        k: v
        for k, v in add.items()
        if k.split(".")[0] in ("num_records", "min", "max", "null_count")
    }


def test_stats_are_the_ones_write_deltalake_wrote(tmp_path):
    n = 20
    table = pa.table(
        {
            "i": pa.array(range(n), pa.int32()),
            "u8": pa.array(np.arange(n), pa.uint8()),
            "f": pa.array(np.linspace(-1, 1, n)),
            "s": pa.array([None if i % 4 == 0 else f"v{i:02d}" for i in range(n)]),
            "b": pa.array([bytes([i]) for i in range(n)], pa.binary()),
            "ts": pa.array(np.arange(n) * 10**9, pa.timestamp("ns", tz="UTC")),
            "d": pa.array(range(n), pa.date32()),
            "st": pa.array([{"a": i, "c": str(i)} for i in range(n)]),
            "lst": pa.array([[float(i)] * 2 for i in range(n)], pa.list_(pa.float32())),
        }
    )
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    write_table(table, ours, rows_per_group=7)
    write_deltalake(theirs, table, **delta_row_group_options(7))

    mine, reference = _stats(ours), _stats(theirs)
    assert mine["num_records"] == n and mine["min.f"] == -1.0 and mine["max.s"] == "v19"
    assert {k: v for k, v in mine.items() if reference.get(k) is not None} == {
        k: v for k, v in reference.items() if v is not None
    }
    assert _checksummed(_files(ours)[0], tmp_path)


def test_schema_is_the_one_write_deltalake_recorded(tmp_path):
    n = 4
    table = pa.table(
        {
            "u8": pa.array(range(n), pa.uint8()),
            "u32": pa.array(range(n), pa.uint32()),
            "img": pa.array([b"\x89PNG"] * n, pa.large_binary()),
            "fixed": pa.array([b"ab"] * n, pa.binary(2)),
            "v": pa.array([[1, 2]] * n, pa.list_(pa.uint8())),
            "fl": pa.array([[1.0, 2.0]] * n, pa.list_(pa.float32(), 2)),
            "ns": pa.array(range(n), pa.timestamp("ns")),
            "name": pa.array(["a", "b"] * 2).dictionary_encode(),
            "split": ["train", "test"] * 2,
        }
    )
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    write_table(table, ours, partition_by=["split"])
    write_deltalake(theirs, table, partition_by=["split"])
    a, b = DeltaTable(ours), DeltaTable(theirs)
    assert a.schema().to_json() == b.schema().to_json()
    assert a.metadata().partition_columns == b.metadata().partition_columns == ["split"]
    assert str(a.protocol()) == str(b.protocol())
    assert pq.read_schema(_files(ours)[0]) == pq.read_schema(_files(theirs)[0])
    assert _checksummed(_files(ours)[0], tmp_path)

    digits = str(tmp_path / "digits")
    ingest_sklearn_digits(digits)
    write_deltalake(str(tmp_path / "ref"), read_table(digits), partition_by=["split"])
    assert DeltaTable(digits).schema() == DeltaTable(str(tmp_path / "ref")).schema()
    with pytest.raises(DataError, match="'u8'.*signed"):  # delta-rs refused it too
        write_table(pa.table({"u8": pa.array([200], pa.uint8())}), str(tmp_path / "big"))


def test_append_overwrite_and_ignore_commit_one_version_each(tmp_path):
    to = str(tmp_path / "t")

    def rows(start):
        return pa.table({"id": pa.array(range(start, start + 10), pa.int64())})

    assert write_table(rows(0), to, rows_per_group=4).version == 0
    with pytest.raises(DataError, match="already exists"):
        write_table(rows(0), to)
    report = write_table(rows(10), to, mode="append", rows_per_group=4)
    assert (report.version, report.rows, report.files, report.row_groups) == (1, 20, 2, 6)
    report = write_table(rows(100), to, mode="overwrite", rows_per_group=5)
    assert (report.version, report.rows, report.row_groups) == (2, 10, 2)
    assert write_table(rows(7), to, mode="ignore").version == 2
    assert DeltaTable(to).version() == 2
    assert read_table(to).column("id").to_pylist() == list(range(100, 110))
    assert sorted(read_table(to, version=1).column("id").to_pylist()) == list(range(20))
    assert all(_checksummed(f, tmp_path) for f in _files(to))


def test_a_streamed_reader_is_one_commit_of_exact_row_groups(tmp_path):
    to = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])

    def batches():
        for start in range(0, 1000, 37):
            ids = np.arange(start, min(start + 37, 1000))
            yield pa.record_batch([ids, pa.array(np.where(ids % 3, "a", "b"))], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    report = write_table(reader, to, partition_by=["p"], rows_per_group=64)
    assert (report.version, report.rows) == (0, 1000) and len(DeltaTable(to).history()) == 1
    for file in _files(to):
        groups = _groups(file)
        assert set(groups[:-1]) == {64} and 0 < groups[-1] <= 64
        assert _checksummed(file, tmp_path)
    assert sorted(read_table(to).column("id").to_pylist()) == list(range(1000))


def test_ingest_into_s3_writes_checksummed_files(s3, tmp_path):
    import boto3

    to = s3.uri("tables/t")
    table = pa.table({"id": pa.array(range(30), pa.int64()), "p": ["x", "y", None] * 10})
    report = write_table(table, to, partition_by=["p"], rows_per_group=4)
    assert (report.version, report.rows, report.files) == (0, 30, 3)
    assert sorted(read_table(to).column("id").to_pylist()) == list(range(30))
    adds = DeltaTable(to, storage_options=delta_storage_options(to)).get_add_actions()
    for add in pa.table(adds).column("path").to_pylist():
        local = tmp_path / os.path.basename(add)
        boto3.client("s3").download_file(s3.name, f"tables/t/{add}", str(local))
        assert _checksummed(str(local), tmp_path)


texts = st.one_of(st.none(), st.sampled_from(["a", "", "x y", "%", "\x01", "é/=", "NaN"]))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parts=st.lists(st.tuples(texts, st.integers(-2, 2)), max_size=40),
    partition_by=st.sampled_from([(), ("s",), ("k",), ("k", "s")]),
    rows_per_group=st.integers(1, 7),
)
def test_rows_in_are_rows_read_back_whatever_the_partitioning(
    tmp_path_factory, parts, partition_by, rows_per_group
):
    tmp = tmp_path_factory.mktemp("t")
    to = str(tmp / "t")
    table = pa.table(
        {
            "id": pa.array(range(len(parts)), pa.int64()),
            "s": pa.array([s for s, _ in parts], pa.string()),
            "k": pa.array([k for _, k in parts], pa.int16()),
        }
    )
    report = write_table(table, to, partition_by=partition_by, rows_per_group=rows_per_group)
    back = read_table(to).sort_by("id").select(["id", "s", "k"])
    assert back.to_pylist() == table.to_pylist() and report.rows == len(parts)
    for file in _files(to):
        groups = _groups(file)
        assert all(g == rows_per_group for g in groups[:-1]) and groups[-1] <= rows_per_group
        assert _checksummed(file, tmp)


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_partition_values_of_every_type_read_back_as_delta_kernel_reads_them(tmp_path, name):
    values = WRITTEN[name]
    if name == "binary":  # written as its UTF-8 text, which is how readers take it back
        values = pa.array([b"\x00\x01\x02", "日本".encode(), b"ab", b"", None], pa.binary())
    path = str(tmp_path / name)
    ids = pa.array(range(len(values)), pa.int64())
    write_table(pa.table({"id": ids, "p": values}), path, partition_by=["p"])
    ours = read_table(path).sort_by("id").column("p").to_pylist()
    assert _same(ours, _kernel(path))
    if name != "decimal":  # kernel reads its own decimal type back
        assert _same(ours, values.to_pylist())
    assert all(_checksummed(f, tmp_path) for f in _files(path))


def test_appending_keeps_the_tables_columns_types_and_partitioning(tmp_path):
    to = str(tmp_path / "t")
    write_table(pa.table({"x": [1, 2], "p": pa.array([1, 2], pa.int32())}), to, partition_by=["p"])
    with pytest.raises(DataError, match=r"columns \['y'\] are not the columns"):
        write_table(pa.table({"y": [1.0]}), to, mode="append")
    with pytest.raises(DataError, match=r"partitioned by \['p'\], not \['x'\]"):
        write_table(pa.table({"x": [3], "p": [3]}), to, mode="append", partition_by=["x"])
    with pytest.raises(DataError, match=r"'p' \(string\) cannot be stored as int32"):
        write_table(pa.table({"p": ["a"], "x": [5]}), to, mode="append")
    # Other types of the same columns are cast to the table's, as delta-rs cast them.
    more = pa.table({"p": ["3"], "x": pa.array([3], pa.int32())})
    assert write_table(more, to, mode="append").version == 1
    assert DeltaTable(to).version() == 1 and DeltaTable(to).metadata().partition_columns == ["p"]
    back = read_table(to).sort_by("x")
    assert back.schema.field("x").type == pa.int64() and back.schema.field("p").type == pa.int32()
    assert back.to_pylist() == [{"x": x, "p": x} for x in (1, 2, 3)]
    assert all(_checksummed(f, tmp_path) for f in _files(to))
