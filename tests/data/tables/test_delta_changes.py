"""data.since_version: the rows a Delta table gained in a range of versions (tables/changes.py).

The delta-rs change-data fixtures (fixtures/delta/README.md) are read for every range and compared
with the rows deltalake's own ``load_cdf`` gives (fixtures/delta/make_cdf_expected.py wrote them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.data import open_table, read_table
from keras_dl.errors import DataError
from tests.data.tables.test_delta_fixtures import as_json

FIXTURES = Path(__file__).parents[1] / "fixtures" / "delta"
EXPECTED = json.loads((FIXTURES / "cdf_expected.json").read_text())
CASES = [pytest.param(e, id=f"{e['table']}({e['since']},{e['version']}]") for e in EXPECTED]


@pytest.mark.parametrize("case", CASES)
def test_since_version_reads_the_rows_load_cdf_inserted_and_kept(case, copy):
    table = read_table(copy(case["table"]), version=case["version"], since_version=case["since"])
    assert sorted(as_json(r) for r in table.to_pylist()) == case["rows"]


def test_change_snapshot_records_the_range_as_lineage(copy):
    path = copy("cdf-table")
    snapshot = open_table(path, version=3, since_version=1)
    assert snapshot.lineage["data.since_version"] == "1"
    assert snapshot.lineage["data.version"] == "3"
    assert "data.since_version" not in open_table(path, version=3).lineage


@pytest.mark.parametrize("since, end", [(3, 3), (3, 1), (-1, 2)])
def test_a_range_that_is_not_one_names_both_versions(copy, since, end):
    with pytest.raises(DataError, match=rf"since_version={since}.*\({end}\)"):
        open_table(copy("cdf-table"), version=end, since_version=since)


def test_a_vacuumed_change_file_names_the_range(copy):
    path = Path(copy("cdf-table"))
    for f in (path / "_change_data").rglob("cdc-00000-ed223ebe*"):
        f.unlink()
    with pytest.raises(DataError, match=r"versions 3 to 3 need file .*cdc-00000-ed223ebe.*VACUUM"):
        open_table(str(path), version=3, since_version=2)


def test_a_checkpoint_only_history_names_the_missing_commits(copy):
    from deltalake import DeltaTable

    path = Path(copy("cdf-table-non-partitioned"))
    DeltaTable(str(path)).create_checkpoint()  # at version 4; commits 0-3 then cleaned up
    for v in range(4):
        (path / "_delta_log" / f"{v:020d}.json").unlink()
    assert open_table(str(path), version=4).version == 4  # the table itself still reads
    with pytest.raises(DataError, match=r"versions 2 to 4.*\[2, 3\].*since_version"):
        open_table(str(path), version=4, since_version=1)


def _write(path: str, ids: list[int], xs: list[int], cdf: bool = True, mode: str = "append"):
    import pyarrow as pa
    from deltalake import write_deltalake

    config = {"delta.enableChangeDataFeed": "true" if cdf else "false"}
    data = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(xs, pa.int64())})
    write_deltalake(path, data, mode=mode, configuration=config)


def test_a_rewrite_without_change_data_names_its_version_and_operation(tmp_path):
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    _write(path, [1, 2, 3], [10, 20, 30], cdf=False)
    _write(path, [4], [40], cdf=False)
    DeltaTable(path).update(updates={"x": "x + 1"}, predicate="id = 2")  # version 2
    appended = read_table(path, version=1, since_version=0)  # an append needs no change data
    assert appended.column("id").to_pylist() == [4]
    for since in (0, 1):
        with pytest.raises(DataError, match=r"version 2 \(UPDATE\).*data.since_version to 2"):
            open_table(path, since_version=since)


# One step of the property: append new ids, delete some ids, update some ids' x (always to a
# value no row held, so every row in the table is distinct and its history can be followed), or
# compact the files.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("delete"), st.sets(st.integers(0, 12), min_size=1, max_size=3)),
        st.tuples(st.just("update"), st.sets(st.integers(0, 12), min_size=1, max_size=3)),
        st.tuples(st.just("compact"), st.none()),  # OPTIMIZE: files rewritten, no data change
    ),
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=st.integers(1, 4), steps=STEPS, data=st.data())
def test_since_version_reads_the_rows_inserted_or_updated_in_the_range_and_still_live(
    tmp_path_factory, first, steps, data
):
    """The property, for tables written by deltalake with the change data feed on:

    ``read_table(t, version=end, since_version=since)`` holds exactly the rows that are in the
    table at ``end`` and whose current value was written (appended, or set by an update) by a
    commit in ``since+1 .. end``. A row appended and then deleted in the range is not read; a
    row updated in the range is read once, as it is at ``end``; rows older than the range that
    a commit in it deleted are not read.
    """
    from deltalake import DeltaTable

    path = str(tmp_path_factory.mktemp("cdf") / "t")
    written: dict[int, tuple[int, int]] = {}  # live id -> (x, version that wrote this x)
    history = []  # the live rows after each version
    version = 0
    _write(path, list(range(first)), [i * 10 for i in range(first)], mode="overwrite")
    written.update({i: (i * 10, 0) for i in range(first)})
    next_id = first
    history.append(dict(written))
    for kind, arg in steps:
        ids = sorted(i for i in arg if i in written) if kind in ("delete", "update") else []
        if kind in ("delete", "update") and not ids:
            continue  # deltalake commits nothing for a predicate that matches no row
        table, where = DeltaTable(path), f"id in ({', '.join(map(str, ids))})"
        upcoming = table.version() + 1
        if kind == "append":
            new = list(range(next_id, next_id + arg))
            next_id += arg
            _write(path, new, [i * 10 for i in new])
            written.update({i: (i * 10, upcoming) for i in new})
        elif kind == "delete":
            table.delete(where)
            for i in ids:
                del written[i]
        elif kind == "update":
            table.update(updates={"x": f"x + {1000 * upcoming}"}, predicate=where)
            written.update({i: (written[i][0] + 1000 * upcoming, upcoming) for i in ids})
        else:
            table.optimize.compact()
        version = DeltaTable(path).version()
        if version == upcoming:
            history.append(dict(written))
        assert version == len(history) - 1
    if version == 0:
        return
    end = data.draw(st.integers(1, version), label="end")
    since = data.draw(st.integers(0, end - 1), label="since")
    expected = sorted((i, x) for i, (x, v) in history[end].items() if v > since)
    got = read_table(path, version=end, since_version=since)
    assert sorted(zip(got.column("id").to_pylist(), got.column("x").to_pylist())) == expected


def test_a_change_snapshot_shards_row_exactly_and_reaches_the_config(copy):
    from keras_dl.config.schema import DataConfig
    from keras_dl.data.stream.shard_epochs import iter_epoch
    from keras_dl.data.tables.stats import count_rows
    from keras_dl.model.sizing import count_split_rows

    path = copy("cdf-table")
    (case,) = [e for e in EXPECTED if (e["table"], e["since"], e["version"]) == ("cdf-table", 0, 3)]
    want = sorted(json.loads(r)["id"] for r in case["rows"])
    snap = open_table(path, version=3, since_version=0)
    stats = count_rows(snap, ["id"])
    assert stats.rows == len(want) == 5
    got = []
    for shard in range(2):
        read = [
            i
            for t in iter_epoch(snap, ["id"], stats, shard=shard, num_shards=2)
            for i in t.column("id").to_pylist()
        ]
        assert len(read) == stats.shard_rows(shard, 2)
        got += read
    assert sorted(got) == want
    data = DataConfig(table=path, version=3, since_version=0, label="name")
    assert count_split_rows(data) == (5, 0)


def test_since_timestamp_starts_after_the_version_committed_by_then(copy):
    path = copy("cdf-table")  # v1 was committed on 2023-12-22, v2 on 2023-12-29
    (case,) = [e for e in EXPECTED if (e["table"], e["since"], e["version"]) == ("cdf-table", 1, 3)]
    table = read_table(path, version=3)  # the whole table, to show the range reads less
    snap = open_table(path, version=3, since_timestamp="2023-12-25T00:00:00+00:00")
    assert snap.since_version == 1 and snap.lineage["data.since_version"] == "1"
    got = read_table(path, version=3, since_version=snap.since_version)
    assert sorted(as_json(r) for r in got.to_pylist()) == case["rows"]
    assert got.num_rows < table.num_rows


def test_tf_data_trains_on_the_changed_rows_only(copy):
    from keras_dl.data import ReadOptions, make_dataset, plan_columns
    from keras_dl.data.stream.features import NUMERIC

    path = copy("cdf-table-non-partitioned")
    (case,) = [
        e
        for e in EXPECTED
        if (e["table"], e["since"], e["version"]) == ("cdf-table-non-partitioned", 1, 4)
    ]
    snap = open_table(path, version=4, since_version=1)
    plan = plan_columns(snap, ["id", "long_field"], None, accept=(NUMERIC,))
    split = make_dataset(snap, plan, ReadOptions(batch_size=3, shuffle=False))
    got = sorted(int(i) for batch in split.dataset for i in batch["id"].numpy())
    assert got == sorted(json.loads(r)["id"] for r in case["rows"])
    assert split.stats.rows == len(case["rows"]) and split.steps == -(-len(case["rows"]) // 3)


def _dv(rows: list[int]) -> dict:
    from tests.fixtures.delta_protocol import bitmap_bytes, z85_encode

    data = bitmap_bytes(rows)
    inline = {"storageType": "i", "pathOrInlineDv": z85_encode(data)}
    return {**inline, "sizeInBytes": len(data), "cardinality": len(rows)}


@pytest.mark.parametrize("cdf", [False, True])
def test_deletion_vectors_in_the_range_apply(tmp_path, cdf):
    """v1 appends a file whose own deletion vector drops 2 of its 5 rows; v2 deletes one more
    row by replacing that deletion vector (no change data written): with the feed off that is a
    rewrite it cannot read, with it on the removed and re-added file count as delete + insert."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.fixtures.delta_protocol import write_protocol_table

    path = tmp_path / "t"
    write_protocol_table(path, [[pa.table({"id": pa.array(range(5), pa.int64())})]])
    pq.write_table(pa.table({"id": pa.array(range(100, 105), pa.int64())}), path / "b.parquet")
    add = {"path": "b.parquet", "partitionValues": {}, "size": 1, "modificationTime": 0}
    log = path / "_delta_log"
    first = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines()]
    meta = next(a for a in first if "metaData" in a)
    meta["metaData"]["configuration"]["delta.enableChangeDataFeed"] = str(cdf).lower()
    commits = [
        [meta, {"add": {**add, "dataChange": True, "deletionVector": _dv([1, 3])}}],
        [
            {"commitInfo": {"operation": "DELETE"}},
            {"remove": {"path": "b.parquet", "dataChange": True, "deletionVector": _dv([1, 3])}},
            {"add": {**add, "dataChange": True, "deletionVector": _dv([1, 3, 4])}},
        ],
    ]
    for v, actions in enumerate(commits, 1):
        (log / f"{v:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    assert sorted(read_table(str(path), version=2).column("id").to_pylist()) == [
        0, 1, 2, 3, 4, 100, 102,
    ]  # fmt: skip
    appended = read_table(str(path), version=1, since_version=0).column("id").to_pylist()
    assert sorted(appended) == [100, 102, 104]
    if not cdf:
        with pytest.raises(DataError, match=r"version 2 \(DELETE\) rewrote 1 file"):
            open_table(str(path), since_version=0)
        return
    assert sorted(read_table(str(path), since_version=0).column("id").to_pylist()) == [100, 102]
    assert read_table(str(path), since_version=1).num_rows == 0  # v2 only deleted
