"""Damaged data files: every read error names the file and the row group, and a page that
fails its CRC checksum stops the read instead of training on altered values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keras_dl.data import open_table, read_table
from keras_dl.errors import DataError
from tests.fixtures.delta_protocol import write_protocol_table

_ROWS = 2000  # per row group: each column chunk is 16 KB of float64


def _table(path, **parquet_options) -> str:
    """One file of three row groups of unique floats, written as keras_dl's writers do."""
    groups = [
        pa.table({"x": np.arange(g * _ROWS, (g + 1) * _ROWS) * 1.25, "label": np.arange(_ROWS) % 3})
        for g in range(3)
    ]
    write_protocol_table(path, [groups], parquet_options=parquet_options)
    return open_table(str(path)).files[0]


def _chunk(file: str, row_group: int) -> tuple[int, int]:
    """``(start, size)`` of column ``x``'s pages in ``row_group`` of ``file``."""
    column = pq.ParquetFile(file).metadata.row_group(row_group).column(0)
    start = column.data_page_offset
    if column.has_dictionary_page:
        start = min(start, column.dictionary_page_offset)
    return start, column.total_compressed_size


def _overwrite(file: str, at: int, data: bytes) -> None:
    with open(file, "r+b") as f:
        f.seek(at)
        f.write(data)


def test_1_kb_overwritten_in_a_data_file_is_named_by_file_and_row_group(tmp_path):
    file = _table(tmp_path / "t")
    start, size = _chunk(file, 1)  # the middle row group
    _overwrite(file, start, bytes(range(256)) * 4)  # 1 KB over its page header and values

    with pytest.raises(DataError) as err:
        read_table(str(tmp_path / "t"), columns=["x", "label"])

    message = str(err.value)
    assert f"file {file!r}, row group 1," in message
    assert "restore" in message


def test_zeroed_bytes_in_a_checksummed_page_stop_the_read(tmp_path):
    # Uncompressed plain pages: without a checksum, zeros would read back as other values.
    file = _table(
        tmp_path / "t", write_page_checksum=True, compression="none", use_dictionary=False
    )
    start, size = _chunk(file, 2)
    _overwrite(file, start + size // 2, b"\0" * 16)  # inside the data page, past its header

    with pytest.raises(DataError) as err:
        read_table(str(tmp_path / "t"), columns=["x", "label"])

    message = str(err.value)
    assert f"file {file!r}, row group 2," in message
    assert "CRC checksum verification failed" in message
