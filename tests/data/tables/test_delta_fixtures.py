"""Real Delta tables written by Databricks Runtime and Apache Spark (see fixtures/delta/README.md)
read exactly: every table and version, through read_table and through the training path."""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns, read_table
from keras_dl.data.stream.features import NUMERIC, STRING
from keras_dl.errors import DataError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "delta"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CASES = [pytest.param(e, id=f"{e['table']}@v{e['version']}") for e in EXPECTED]


def as_json(row: dict) -> str:
    """A row as expected.json writes it: sorted keys, floats to 6 places, ISO times, hex bytes."""
    return json.dumps({k: _plain(v) for k, v in row.items()}, sort_keys=True)


def _plain(v):
    if isinstance(v, (float, np.floating)):
        return round(float(v), 6)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, bytes | np.bytes_):
        return bytes(v).hex()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, np.str_):
        return str(v)
    return v


@pytest.mark.parametrize("case", CASES)
def test_read_table_returns_exactly_the_rows_of_each_version(case, copy):
    table = read_table(copy(case["table"]), version=case["version"])
    assert sorted(table.column_names) == case["columns"]
    assert sorted(as_json(r) for r in table.to_pylist()) == case["rows"]


@pytest.mark.parametrize("case", CASES)
def test_the_training_path_reads_the_same_rows(case, copy):
    snap = open_table(copy(case["table"]), version=case["version"])
    # The columns a recipe can take as features (numbers and strings), all read as features.
    usable = [f.name for f in snap.schema if str(f.type) == "string" or _numeric(f.type)]
    plan = plan_columns(snap, usable, None, accept=(NUMERIC, STRING))
    if any('": null' in r for r in case["rows"]):
        # The training path takes no nulls: it refuses them by column before reading a row.
        with pytest.raises(DataError, match=r"null"):
            make_dataset(snap, plan, ReadOptions(batch_size=3, shuffle=False))
        return
    split = make_dataset(snap, plan, ReadOptions(batch_size=3, shuffle=False))
    rows = []
    for batch in split.dataset:
        batch = batch if isinstance(batch, dict) else {usable[0]: batch}
        columns = {k: v.numpy() for k, v in batch.items()}
        for i in range(len(next(iter(columns.values())))):
            rows.append({k: _decode(columns[k][i]) for k in usable})
    expected = sorted(
        json.dumps({k: json.loads(r)[k] for k in usable}, sort_keys=True) for r in case["rows"]
    )
    assert sorted(as_json(r) for r in rows) == expected
    assert split.steps == -(-len(case["rows"]) // 3) and split.stats.rows == len(case["rows"])


def test_a_null_partition_value_is_a_null_and_stops_training_by_name(copy):
    path = copy("delta-0.8.0-null-partition")
    rows = sorted(read_table(path).to_pylist(), key=lambda r: r["v"])
    assert rows == [{"k": "A", "v": 1}, {"k": None, "v": 2}]
    snap = open_table(path)
    plan = plan_columns(snap, ["k"], "v", accept=(STRING,))
    with pytest.raises(DataError, match=r"Partition column 'k' is null in file .*k=__HIVE"):
        make_dataset(snap, plan, ReadOptions(batch_size=2, shuffle=False))


def test_deletion_vector_rows_never_leave_the_reader_and_counts_agree(copy):
    path = copy("table-with-dv-small")
    assert sorted(read_table(path, version=0).column("value").to_pylist()) == list(range(10))
    v1 = read_table(path, version=1).column("value").to_pylist()
    assert sorted(v1) == list(range(1, 9))
    snap = open_table(path)
    assert snap.deleted_rows[0].tolist() == [0, 9]
    plan = plan_columns(snap, ["value"], None)
    train = make_dataset(snap, plan, ReadOptions(batch_size=4, training=True))
    assert train.stats.rows == 8 and train.steps == 2
    seen = np.concatenate([b.numpy() for b in train.dataset.take(2 * train.steps)])
    assert sorted(seen.tolist()[:8]) == sorted(seen.tolist()[8:]) == list(range(1, 9))


def test_column_mapping_gives_logical_names_and_mapped_partition_values(copy):
    path = copy("table_with_column_mapping")
    snap = open_table(path)
    assert snap.schema.names == ["Company Very Short", "Super Name"]
    assert snap.physical_schema.names[1].startswith("col-")
    table = read_table(path, filters=["Company Very Short = BMS"], columns=["Super Name"])
    assert sorted(table.column("Super Name").to_pylist()) == [
        "Anthony Johnson",
        "Mr. Daniel Ferguson MD",
        "Nathan Bennett",
        "Stephanie Mcgrath",
    ]


def test_v2_checkpoint_table_reads_through_its_checkpoint_alone(copy, tmp_path):
    path = copy("checkpoint-v2-table")
    full = read_table(path)
    # Drop every commit the v2 checkpoint at version 8 covers: the state must come from it.
    for v in range(0, 9):
        (Path(path) / "_delta_log" / f"{v:020d}.json").unlink()
    assert sorted(read_table(path).column("id").to_pylist()) == sorted(
        full.column("id").to_pylist()
    )
    with pytest.raises(DataError, match=r"no version 3"):
        read_table(path, version=3)


def test_classic_checkpoint_alone_gives_version_10(copy):
    path = copy("simple_table_with_checkpoint")
    for v in range(0, 10):
        (Path(path) / "_delta_log" / f"{v:020d}.json").unlink()
    assert read_table(path).num_rows == 11


def test_a_log_with_a_gap_and_no_checkpoint_is_refused(copy):
    path = copy("basic_partitioned")
    (Path(path) / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(DataError, match=r"commit\(s\) \[0\] are missing"):
        read_table(path)


def _numeric(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _decode(v):
    if isinstance(v, bytes):
        return v.decode()
    return v.item() if hasattr(v, "item") else v
