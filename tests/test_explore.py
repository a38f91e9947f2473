"""keras_dl.explore: a table's layout against the planned workers, and sample rows."""

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from keras_dl.errors import DataError
from keras_dl.explore import describe_table, read_sample


def test_layout_against_workers(digits_table):
    ok = describe_table(digits_table, workers=2, split_column="split")
    assert ok.ok and [p.name for p in ok.parts] == ["split=test", "split=train", "split=validation"]
    assert sum(p.rows for p in ok.parts) == 1797
    assert ok.parts[1].row_groups == 10  # 1257 train rows in groups of 128
    many = describe_table(digits_table, workers=4, split_column="split")
    test, validation = many.problems  # 360 and 180 rows: 3 and 2 row groups < 4 workers
    assert test.startswith("split=test: 3 row group(s) for 4 workers, so 1 would get no data")
    assert validation.startswith("split=validation: 2 row group(s) for 4 workers")
    assert "--rows-per-group 22" in validation and "! split=validation" in str(many)


def test_split_column_must_be_a_partition(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"x": [1.0, 2.0], "split": ["train", "test"]}))
    with pytest.raises(DataError, match="'split' is not a partition column"):
        describe_table(table, split_column="split")
    assert describe_table(table, workers=2).problems  # one row group for two workers


def test_read_sample_includes_partition_columns(digits_table):
    sample = read_sample(digits_table, rows=5)
    assert len(sample) == 5 and set(sample.columns) == {"pixels", "label", "split"}
    assert len(sample["pixels"][0]) == 64
