"""Data skipping: filters skip files by the Delta log's statistics and row groups by their
Parquet statistics, and a skipping read returns exactly the rows a full read returns."""

from __future__ import annotations

import itertools
import json
import math
import uuid
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.data import open_table, read_table
from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.data.tables.stats import scan_table
from keras_dl.errors import DataError
from tests.fixtures.delta_protocol import write_protocol_table

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
LONG = "p" * 32  # as long as Delta's string prefix: a maximum this long may have been cut
STAMPS = [T0 + timedelta(microseconds=us) for us in (0, 400, 999, 1500)]
OPS = ["=", "!=", "<", "<=", ">", ">=", "in", "not in"]
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("x", pa.int64()),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def tables(draw):
    """Files of row groups of rows with nulls, NaN, long strings and sub-millisecond times.

    Each file draws its values of a column from a palette of one or two, so files and row groups
    whose statistics sit exactly at a filter's value (min = max, a cut maximum) are common."""
    ids = itertools.count()
    files, deleted = [], []
    for _ in range(draw(st.integers(1, 4))):
        palette = {
            c: draw(st.lists(st.sampled_from(DOMAIN[c]), min_size=1, max_size=2)) for c in DOMAIN
        }
        groups = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.integers(1, 5))
            group = {"id": [next(ids) for _ in range(n)]}
            for c in DOMAIN:
                group[c] = [draw(st.sampled_from(palette[c])) for _ in range(n)]
            groups.append(group)
        files.append(groups)
        rows = sum(len(g["id"]) for g in groups)
        deleted.append(draw(st.lists(st.integers(0, rows - 1), unique=True, max_size=rows)))
    filters = [draw(filters_()) for _ in range(draw(st.integers(1, 2)))]
    return {
        "files": files,
        "deleted": deleted,
        "filters": filters,
        "mapping": draw(st.booleans()),
        "column_stats": draw(st.booleans()),
    }


DOMAIN = {
    "x": [None, 0, 1, 2, 5],
    "f": [None, math.nan, -1.5, 1.0, 2.5],
    "s": [None, "", "a", LONG, LONG + "a", LONG + "z"],
    "ts": [None, *STAMPS],
}
VALUES = {
    "x": [-1, 0, 1, 2, 3, 5, 6],
    "f": [-1.5, 0.0, 1.0, 2.5],
    "s": ["", "a", "b", LONG, LONG + "m", LONG + "z", "p"],
    "ts": [*STAMPS, T0 + timedelta(microseconds=500)],
}


@st.composite
def filters_(draw):
    column = draw(st.sampled_from(list(VALUES)))
    domain = st.sampled_from(VALUES[column])
    op = draw(st.sampled_from(OPS))
    if op in ("in", "not in"):
        return column, op, draw(st.lists(domain, min_size=1, max_size=3))
    return column, op, draw(domain)


def write(spec, root: Path) -> str:
    path = str(root / f"t-{uuid.uuid4().hex[:8]}")
    files = [[pa.table(g, schema=SCHEMA) for g in groups] for groups in spec["files"]]
    write_protocol_table(
        path,
        files,
        spec["deleted"],
        mapping=spec["mapping"],
        column_stats=spec["column_stats"],
    )
    return path


def expected(spec) -> Counter:
    """The ids a full read keeps: SQL semantics (a null passes nothing; NaN compares false,
    except that it differs from everything)."""
    out = Counter()
    for groups, deleted in zip(spec["files"], spec["deleted"], strict=True):
        rows = [dict(zip(g, vals, strict=True)) for g in groups for vals in zip(*g.values())]
        for i, row in enumerate(rows):
            if i not in deleted and all(_passes(row[c], op, v) for c, op, v in spec["filters"]):
                out[row["id"]] += 1
    return out


def _passes(actual, op, value) -> bool:
    if actual is None:
        return False
    if op == "in":
        return any(actual == v for v in value)
    if op == "not in":
        return all(actual != v for v in value)
    return {
        "=": actual == value,
        "!=": actual != value,
        "<": actual < value,
        "<=": actual <= value,
        ">": actual > value,
        ">=": actual >= value,
    }[op]


def read_ids(path: str, filters, skipping: bool, shards: int = 1) -> tuple[Counter, object]:
    snapshot = replace(open_table(path), data_skipping=skipping)
    snapshot = select(snapshot, filters)
    stats = scan_table(snapshot)
    ids = Counter()
    for shard in range(shards):
        for part in iter_epoch(snapshot, ["id"], stats, shard=shard, num_shards=shards):
            ids.update(part.column("id").to_pylist())
    return ids, (snapshot, stats)


@pytest.mark.slow  # about 25-45 s on 2 shared cores
@settings(max_examples=80, **SETTINGS)
@given(spec=tables(), shards=st.integers(1, 3))
def test_a_skipping_read_returns_the_rows_of_a_full_read(tmp_path, spec, shards):
    path = write(spec, tmp_path)
    want = expected(spec)
    full, _ = read_ids(path, spec["filters"], skipping=False)
    shards = min(shards, max(1, sum(want.values())))
    skipped, (snapshot, stats) = read_ids(path, spec["filters"], True, shards)
    assert full == want
    assert skipped == want  # as multisets: every matching live row once, nothing else
    assert stats.rows == sum(want.values())
    assert (snapshot.skipped_files > 0) <= spec["column_stats"]  # only the log's stats skip files


def test_files_the_stats_exclude_are_never_opened(tmp_path):
    files = [[pa.table({"id": list(range(k * 10, k * 10 + 10)), "x": [k] * 10})] for k in range(4)]
    write_protocol_table(tmp_path / "t", files, column_stats=True)
    for part in sorted((tmp_path / "t").glob("part-0000[013]*.parquet")):
        part.write_bytes(b"not parquet")  # x = 0, 1 and 3: a read of them fails
    got = read_table(str(tmp_path / "t"), filters=["x = 2"])
    assert sorted(got.column("id").to_pylist()) == list(range(20, 30))
    snapshot = select(open_table(str(tmp_path / "t")), [("x", "=", 2)])
    assert (len(snapshot.files), snapshot.skipped_files) == (1, 3)
    with pytest.raises(DataError, match="is not readable Parquet"):
        read_table(str(tmp_path / "t"), filters=["x >= 2"])


def test_row_groups_their_footers_exclude_are_not_read(tmp_path):
    table = pa.table({"id": list(range(40)), "x": [i // 10 for i in range(40)]})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=10)
    snapshot = select(
        open_table(str(tmp_path / "f.parquet")), parse_filters(["x in 1|3"], table.schema)
    )
    stats = scan_table(snapshot)
    assert (stats.rows, stats.rows_scanned, stats.row_groups_skipped) == (20, 20, 2)
    assert stats.group_rows == ((0, 10, 0, 10),)
    full = scan_table(replace(snapshot, data_skipping=False))
    assert (full.rows, full.rows_scanned, full.row_groups_skipped) == (20, 40, 0)
    got = read_table(str(tmp_path / "f.parquet"), filters=["x in 1|3"])
    assert sorted(got.column("id").to_pylist()) == [*range(10, 20), *range(30, 40)]


def test_nulls_nan_cut_strings_and_millisecond_times_are_not_skipped_wrongly(tmp_path):
    stamp = T0 + timedelta(microseconds=900)  # the log says .000 (cut to milliseconds)
    files = [
        [pa.table({"id": [0, 1], "x": pa.array([None, None], pa.int64()), "f": [1.0, math.nan]})],
        [pa.table({"id": [2, 3], "x": pa.array([5, None], pa.int64()), "f": [1.0, 1.0]})],
    ]
    write_protocol_table(tmp_path / "a", files, column_stats=True)
    path = str(tmp_path / "a")
    assert ids(path, ["x != 7"]) == [2]  # file 0 (all null) is skipped, even for !=
    assert select(open_table(path), [("x", "!=", 7)]).skipped_files == 1
    assert ids(path, ["f != 1"]) == [1]  # the NaN row: min = max = 1 proves nothing for floats
    assert ids(path, ["f not in 1.0"]) == [1]
    cut = LONG + "z"
    stamps = pa.array([stamp, T0], pa.timestamp("us", tz="UTC"))
    write_protocol_table(
        tmp_path / "b",
        [[pa.table({"id": [0, 1], "s": [cut, "a"], "ts": stamps})]],
        column_stats=True,
    )
    log = json.loads((tmp_path / "b/_delta_log" / f"{0:020d}.json").read_text().splitlines()[-1])
    stats = json.loads(log["add"]["stats"])
    assert stats["maxValues"] == {"id": 1, "s": LONG, "ts": "2024-01-01T00:00:00.000Z"}
    assert ids(str(tmp_path / "b"), [f"s > {LONG}m"]) == [0]
    assert ids(str(tmp_path / "b"), ["ts > 2024-01-01T00:00:00.000500+00:00"]) == [0]
    assert ids(str(tmp_path / "b"), ["s < a"]) == []  # a cut minimum still bounds: skipped
    assert select(open_table(str(tmp_path / "b")), [("s", "<", "a")]).skipped_files == 1
    assert select(open_table(str(tmp_path / "b")), [("s", ">", "r")]).skipped_files == 0


def test_float32_and_decimal_bounds_compare_as_the_reader_does(tmp_path):
    x = pa.array([0.1, 0.5], pa.float32())
    write_protocol_table(tmp_path / "t", [[pa.table({"id": [0, 1], "x": x})]], column_stats=True)
    log = (tmp_path / "t/_delta_log" / f"{0:020d}.json").read_text().splitlines()[-1]
    assert (
        json.loads(json.loads(log)["add"]["stats"])["minValues"]["x"] == 0.1
    )  # as Spark writes 0.1f
    assert ids(str(tmp_path / "t"), ["x <= 0.1"]) == [0]  # 0.1f <= 0.1f: not skipped
    assert ids(str(tmp_path / "t"), ["x < 0.1"]) == []
    # 0.1000000001 is 0.1f as a float32 (the reader's comparison): above the log's 0.1 as a
    # double, not above the row's value.
    assert ids(str(tmp_path / "t"), ["x >= 0.1000000001", "x < 0.2"]) == [0]
    assert ids(str(tmp_path / "t"), ["x >= 0.5"]) == [1]
    from decimal import Decimal

    from keras_dl.data.tables.skipping import Bounds, may_match

    big = pa.decimal128(20, 2)
    exact = Bounds(
        rows=1, nulls=0, low=Decimal("12345678901234567.89"), high=Decimal("12345678901234567.89")
    )
    assert may_match("=", Decimal("12345678901234567.89"), exact, big)
    assert not may_match("=", Decimal("12345678901234567.88"), exact, big)
    from keras_dl.data.tables.delta import file_stats

    stats = file_stats({"stats": '{"numRecords": 1, "minValues": {"d": 12345678901234567.89}}'})
    assert stats["minValues"]["d"] == Decimal("12345678901234567.89")  # not through a double


def test_column_mapping_stats_are_read_by_physical_name(tmp_path):
    files = [[pa.table({"id": [k], "x": [k]})] for k in range(3)]
    write_protocol_table(tmp_path / "t", files, mapping=True, column_stats=True)
    snapshot = select(open_table(str(tmp_path / "t")), [("x", ">=", 2)])
    assert (len(snapshot.files), snapshot.skipped_files) == (1, 2)
    assert ids(str(tmp_path / "t"), ["x >= 2"]) == [2]


def test_checkpoint_stats_parsed_skip_files(tmp_path):
    import deltalake

    path = str(tmp_path / "t")
    config = {
        "delta.checkpoint.writeStatsAsStruct": "true",
        "delta.checkpoint.writeStatsAsJson": "false",
    }
    for k in range(3):
        stamps = pa.array([T0 + timedelta(days=k)] * 2, pa.timestamp("us", tz="UTC"))
        deltalake.write_deltalake(
            path,
            pa.table({"id": [2 * k, 2 * k + 1], "ts": stamps}),
            mode="append",
            configuration=config if k == 0 else None,
        )
    deltalake.DeltaTable(path).create_checkpoint()
    for commit in (Path(path) / "_delta_log").glob("*.json"):
        commit.unlink()  # only the checkpoint (its stats_parsed) is left to read
    snapshot = open_table(path)
    assert [s["numRecords"] for s in snapshot.file_stats] == [2, 2, 2]  # from stats_parsed
    chosen = select(snapshot, parse_filters(["ts >= 2024-01-03"], snapshot.schema))
    assert (len(chosen.files), chosen.skipped_files) == (1, 2)
    assert ids(path, ["ts >= 2024-01-03"]) == [4, 5]


def test_a_filter_on_an_unknown_column_names_it(tmp_path):
    write_protocol_table(tmp_path / "t", [[pa.table({"id": [1], "x": [1]})]], column_stats=True)
    with pytest.raises(DataError, match="'nope' is not in the table"):
        read_table(str(tmp_path / "t"), filters=["nope > 1"])


def ids(path: str, filters) -> list:
    return sorted(read_table(path, columns=["id"], filters=filters).column("id").to_pylist())
