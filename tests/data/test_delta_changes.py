"""data.since_version: the rows a Delta table gained in a range of versions (tables/changes.py).

The delta-rs change-data fixtures (fixtures/delta/README.md) are read for every range and compared
with the rows deltalake's own ``load_cdf`` gives (fixtures/delta/make_cdf_expected.py wrote them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from keras_dl.data import open_table, read_table
from keras_dl.errors import DataError
from tests.data.test_delta_fixtures import as_json

FIXTURES = Path(__file__).parent / "fixtures" / "delta"
EXPECTED = json.loads((FIXTURES / "cdf_expected.json").read_text())
CASES = [pytest.param(e, id=f"{e['table']}({e['since']},{e['version']}]") for e in EXPECTED]


@pytest.fixture
def copy(tmp_path):
    def make(name: str) -> str:
        target = tmp_path / name
        shutil.copytree(FIXTURES / name, target)
        return str(target)

    return make


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
