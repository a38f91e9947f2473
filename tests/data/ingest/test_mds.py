"""``keras-dl ingest mds``: an MDS folder into a Delta table, row for row."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from keras_dl.data.ingest.mds import ingest_mds
from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables import open_table
from keras_dl.data.tables.stats import count_rows
from keras_dl.errors import DataError
from tests.conftest import run_cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mds"


def _rows(table: str) -> list[dict]:
    snapshot = open_table(table)
    stats = count_rows(snapshot, snapshot.schema.names)
    return pa.concat_tables(list(iter_epoch(snapshot, snapshot.schema.names, stats))).to_pylist()


def test_ingest_mds_writes_every_row_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_DL_MDS_CACHE", str(tmp_path / "cache"))
    to = str(tmp_path / "delta")
    done = run_cli("ingest", "mds", "--to", to, str(FIXTURES / "compressed_gz"))
    assert done.returncode == 0, done.stderr
    assert "version 0: 12 rows" in done.stdout
    assert open_table(to).format == "delta"
    assert _rows(to) == _rows(str(FIXTURES / "compressed_gz"))


def test_unsigned_and_half_floats_are_widened_exactly(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_DL_MDS_CACHE", str(tmp_path / "cache"))
    from keras_dl.data.ingest.mds import _delta_field, _widened

    batch = pa.record_batch(
        {"u8": pa.array([255], pa.uint8()), "u32": pa.array([2**32 - 1], pa.uint32())}
        | {"f16": pa.array([0.5], pa.float16()), "v": pa.array([[1, 2]], pa.list_(pa.uint16(), 2))}
    )
    schema = pa.schema([_delta_field(f) for f in batch.schema])
    out = _widened(batch, schema, "x")
    assert out.schema.types == [pa.int16(), pa.int64(), pa.float32(), pa.list_(pa.int32())]
    assert out.to_pylist() == [{"u8": 255, "u32": 2**32 - 1, "f16": 0.5, "v": [1, 2]}]


def test_uint64_beyond_int64_is_refused_by_column(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_DL_MDS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataError, match="Column 'u64'.*int64's maximum"):
        ingest_mds(str(FIXTURES / "scalars"), str(tmp_path / "delta"))


def test_a_folder_without_an_index_is_refused(tmp_path):
    with pytest.raises(DataError, match="not an MDS dataset"):
        ingest_mds(str(tmp_path), str(tmp_path / "delta"))
