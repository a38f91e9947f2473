"""The Delta protocol as a reader must follow it: protocol checks, typed partition values,
timestamp_ntz, column mapping by field id, schema changes and damaged logs."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from keras_dl.data import open_table, read_table
from keras_dl.errors import DataError


def _commit(path, version: int, *actions) -> None:
    log = Path(path) / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [{"commitInfo": {"timestamp": 1_700_000_000_000 + version}}, *actions]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in lines) + "\n")


def _meta(fields, partitions=(), mapping="none"):
    return {
        "metaData": {
            "id": "t",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps({"type": "struct", "fields": fields}),
            "partitionColumns": list(partitions),
            "configuration": {"delta.columnMapping.mode": mapping},
        }
    }


def _protocol(*features, reader=3):
    p = {"minReaderVersion": reader, "minWriterVersion": 7}
    if reader == 3:
        p["readerFeatures"] = list(features)
        p["writerFeatures"] = list(features)
    return {"protocol": p}


def _add(path, rel, table, partition_values=None):
    target = Path(path) / unquote(rel)  # the log holds the URL-encoded path
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target)
    return {
        "add": {
            "path": rel,
            "partitionValues": partition_values or {},
            "size": target.stat().st_size,
            "modificationTime": 0,
            "dataChange": True,
        }
    }


def _f(name, kind, **meta):
    return {"name": name, "type": kind, "nullable": True, "metadata": meta}


@pytest.mark.parametrize("feature", ["variantType", "catalogManaged", "someFutureFeature"])
def test_an_unsupported_reader_feature_is_refused_by_name(tmp_path, feature):
    path = str(tmp_path / "t")
    _commit(path, 0, _protocol("deletionVectors", feature), _meta([_f("x", "long")]))
    with pytest.raises(DataError, match=rf"reader feature\(s\) {feature}.*{Path(path).name}"):
        open_table(path)


def test_a_newer_reader_version_is_refused(tmp_path):
    path = str(tmp_path / "t")
    _commit(path, 0, _protocol(reader=4), _meta([_f("x", "long")]))
    with pytest.raises(DataError, match=r"needs reader version 4"):
        open_table(path)


def test_a_delta_log_that_cannot_be_read_is_never_read_as_parquet(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"x": np.arange(4)}))
    write_deltalake(str(path), pa.table({"x": np.arange(4)}), mode="overwrite")
    (path / "_delta_log" / f"{1:020d}.json").write_text("{not json\n")
    with pytest.raises(DataError, match=r"00000000000000000001.json.* line 1 is not JSON"):
        read_table(str(path))
    for f in (path / "_delta_log").iterdir():
        f.unlink()  # an empty log: still Delta, and refused (the folder holds removed files)
    with pytest.raises(DataError, match=r"no commit in it"):
        read_table(str(path))


def test_typed_partition_values_timestamp_ntz_dates_and_decimals(tmp_path):
    path = str(tmp_path / "t")
    fields = [
        _f("id", "long"),
        _f("at", "timestamp_ntz"),
        _f("day", "date"),
        _f("price", "decimal(10,2)"),
        _f("ok", "boolean"),
        _f("when", "timestamp"),
        _f("name", "string"),
    ]
    parts = ["day", "price", "ok", "when", "name"]
    data = pa.table(
        {"id": pa.array([1, 2], pa.int64()), "at": pa.array([datetime(2024, 1, 2, 3, 4, 5)] * 2)}
    )
    _commit(
        path,
        0,
        _protocol("timestampNtz"),
        _meta(fields, parts),
        _add(
            path,
            "day=2024-02-29/a%20b.parquet",
            data,
            {
                "day": "2024-02-29",
                "price": "12.50",
                "ok": "true",
                "when": "2024-01-01 10:00:00.5",
                "name": "a b/é",
            },
        ),
        _add(
            path,
            "nulls.parquet",
            data,
            {"day": None, "price": "", "ok": None, "when": None, "name": ""},
        ),
    )
    table = read_table(path)
    assert table.schema.field("at").type == pa.timestamp("us")
    assert table.schema.field("when").type == pa.timestamp("us", tz="UTC")
    rows = sorted(table.to_pylist(), key=lambda r: (r["day"] is None, r["id"]))
    assert rows[0] == {
        "id": 1,
        "at": datetime(2024, 1, 2, 3, 4, 5),
        "day": date(2024, 2, 29),
        "price": Decimal("12.50"),
        "ok": True,
        "when": datetime(2024, 1, 1, 10, 0, 0, 500000, tzinfo=timezone.utc),
        "name": "a b/é",
    }
    assert rows[-1]["day"] is rows[-1]["price"] is None
    assert rows[-1]["name"] == ""  # an empty text: the empty string (delta-kernel, Spark)
    only = read_table(path, filters=["day >= 2024-01-01"], columns=["id"])
    assert only.num_rows == 2  # the null partition matches no filter


def test_column_mapping_id_mode_matches_columns_by_field_id(tmp_path):
    path = str(tmp_path / "t")
    fields = [
        _f(
            "a b", "long", **{"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "p1"}
        ),
        _f(
            "c.d",
            "string",
            **{"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "p2"},
        ),
    ]
    # The file's names are not the physical names: id mode must match by field id alone.
    schema = pa.schema(
        [
            pa.field("other2", pa.string(), metadata={b"PARQUET:field_id": b"2"}),
            pa.field("other1", pa.int64(), metadata={b"PARQUET:field_id": b"1"}),
        ]
    )
    data = pa.table({"other2": ["x", "y"], "other1": [1, 2]}, schema=schema)
    _commit(
        path,
        0,
        _protocol("columnMapping"),
        _meta(fields, mapping="id"),
        _add(path, "f.parquet", data),
    )
    assert read_table(path).to_pylist() == [{"a b": 1, "c.d": "x"}, {"a b": 2, "c.d": "y"}]


def test_a_column_added_later_reads_as_nulls_in_older_files(tmp_path):
    path = str(tmp_path / "t")
    v0 = [_f("x", "long")]
    _commit(path, 0, _protocol(), _meta(v0), _add(path, "a.parquet", pa.table({"x": [1, 2]})))
    v1 = [_f("x", "long"), _f("y", "double")]
    new = pa.table({"x": [3], "y": [0.5]})
    _commit(path, 1, _meta(v1), _add(path, "b.parquet", new))
    assert read_table(path, version=0).column_names == ["x"]
    rows = sorted(read_table(path).to_pylist(), key=lambda r: r["x"])
    assert rows == [{"x": 1, "y": None}, {"x": 2, "y": None}, {"x": 3, "y": 0.5}]


def test_time_travel_by_timestamp_uses_commit_times(tmp_path):
    path = str(tmp_path / "t")
    _commit(
        path,
        0,
        _protocol(),
        _meta([_f("x", "long")]),
        _add(path, "a.parquet", pa.table({"x": [1]})),
    )
    _commit(path, 1, _add(path, "b.parquet", pa.table({"x": [2]})))
    at0 = datetime.fromtimestamp(1_700_000_000_000.5 / 1000, timezone.utc).isoformat()
    assert read_table(path, timestamp=at0).column("x").to_pylist() == [1]
    at1 = datetime.fromtimestamp(1_700_000_000_001 / 1000, timezone.utc).isoformat()
    assert sorted(read_table(path, timestamp=at1).column("x").to_pylist()) == [1, 2]
    with pytest.raises(DataError, match=r"no version at or before 2000"):
        read_table(path, timestamp="2000-01-01T00:00:00+00:00")


def test_a_timestamp_after_the_last_commit_is_refused_naming_that_commits_time(tmp_path):
    path = str(tmp_path / "t")
    _commit(path, 0, _protocol(), _meta([_f("x", "long")]))
    _commit(path, 1, _add(path, "a.parquet", pa.table({"x": [1]})))
    last = datetime.fromtimestamp(1_700_000_000_001 / 1000, timezone.utc).isoformat()
    after = "2030-01-01T00:00:00"  # a commit made before 2030 could still change what it reads
    with pytest.raises(DataError) as err:
        read_table(path, timestamp=after)
    assert path in str(err.value) and after in str(err.value)
    assert f"last commit (version 1, committed at {last})" in str(err.value)
    assert "drop data.timestamp" in str(err.value)
