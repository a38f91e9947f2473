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
    # 360 and 180 rows in 3 and 2 row groups for 4 workers: exact (shards are cut by rows), but
    # the workers share row groups.
    assert many.ok and not many.problems
    test, validation = many.notes
    assert test.startswith("split=test: 3 row group(s) for 4 workers, so workers share")
    assert "--rows-per-group 22" in validation and "note: split=validation" in str(many)
    few = describe_table(digits_table, workers=200, split_column="split")
    assert [p.split(":")[0] for p in few.problems] == ["split=validation"]  # 180 rows


def test_split_column_must_be_a_partition(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"x": [1.0, 2.0], "split": ["train", "test"]}))
    with pytest.raises(DataError, match="'split' is not a partition column"):
        describe_table(table, split_column="split")
    assert describe_table(table, workers=2).notes  # one row group for two workers
    assert describe_table(table, workers=3).problems  # two rows for three workers


def test_read_sample_includes_partition_columns(digits_table):
    sample = read_sample(digits_table, rows=5)
    assert len(sample) == 5 and set(sample.columns) == {"pixels", "label", "split"}
    assert len(sample["pixels"][0]) == 64
