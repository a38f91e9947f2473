"""The training manifest names exactly the rows a split reads (deletion vectors, filters and the
split selector applied) and the fingerprint names them: equal for the same version and split,
different for a table dropped and written again at the same path."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest

from keras_dl.data import open_table, read_table
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.lineage.manifest import files_table, fingerprint, from_header, to_header
from keras_dl.lineage.record import split_manifest
from tests.fixtures.delta_protocol import write_protocol_table


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "customer_id": ids % 7,
            "split": ["train" if i % 5 else "test" for i in ids],
        }
    )


def table(path, deleted=None):
    files = [[rows(0, 10), rows(10, 10)], [rows(20, 15)]]
    write_protocol_table(path, files, deleted or [[3, 4, 15], []])
    return str(path)


def train_snapshot(path, filters=()):
    snap = open_table(path)
    return select(snap, parse_filters(["split = train", *filters], snap.schema))


def trained_ids(m, snap) -> list[int]:
    """The ids at the manifest's positions, read from the files directly."""
    import pyarrow.parquet as pq

    out = []
    for f, uri in zip(m.files, snap.files, strict=True):
        ids = pq.read_table(uri, columns=["id"]).column("id").to_numpy()
        out.extend(ids[f.positions()].tolist())
    return sorted(out)


@pytest.mark.parametrize("filters", [(), ("customer_id != 3",)])
def test_the_manifest_holds_the_rows_the_split_reads(tmp_path, filters):
    path = table(tmp_path / "t")
    snap = train_snapshot(path, filters)
    m, values = split_manifest("train", snap, filters, ("split", "train"), ["customer_id"])
    expected = read_table(path, filters=["split = train", *filters]).column("id").to_pylist()
    assert trained_ids(m, snap) == sorted(expected)
    assert m.rows == len(expected) == values.num_rows
    assert sorted(values.column("customer_id").to_pylist()) == sorted(i % 7 for i in expected)
    assert m.table_id == snap.table_id is not None and m.version == 0
    assert m.files[0].deletion_vector is not None and m.files[1].deletion_vector is None
    # Stored and read back, it is the same manifest with the same fingerprint.
    back = from_header(to_header(m, "train.files.parquet", None), files_table(m))
    assert back == m and fingerprint(back) == fingerprint(m)


def test_a_file_read_whole_is_one_run_and_opens_nothing(tmp_path):
    path = table(tmp_path / "t", deleted=[[], []])
    m, values = split_manifest("all", open_table(path))
    assert [f.ranges for f in m.files] == [((0, 20),), ((0, 15),)] and values is None


def test_the_fingerprint_is_equal_for_the_same_version_and_split(tmp_path):
    path = table(tmp_path / "t")
    first, _ = split_manifest("train", train_snapshot(path), (), ("split", "train"))
    again, _ = split_manifest("train", train_snapshot(path), (), ("split", "train"))
    assert fingerprint(first) == fingerprint(again)
    test_split, _ = split_manifest("test", train_snapshot(path), (), ("split", "test"))
    assert fingerprint(test_split) != fingerprint(first)
    other, _ = split_manifest("train", train_snapshot(path, ["id < 30"]), ["id < 30"])
    assert fingerprint(other) != fingerprint(first)


def test_the_fingerprint_differs_for_a_table_dropped_and_written_again(tmp_path):
    path = tmp_path / "t"
    before, _ = split_manifest("train", train_snapshot(table(path)), (), ("split", "train"))
    shutil.rmtree(path)
    after, _ = split_manifest("train", train_snapshot(table(path)), (), ("split", "train"))
    # Same path, same version 0, same rows in files of the same names: another table.
    assert (after.table, after.version, after.rows) == (before.table, before.version, before.rows)
    assert after.table_id != before.table_id
    assert fingerprint(after) != fingerprint(before)


def test_the_fingerprint_differs_when_a_deletion_vector_changes(tmp_path):
    a, _ = split_manifest("x", open_table(table(tmp_path / "a", [[3], []])))
    b, _ = split_manifest("x", open_table(table(tmp_path / "b", [[4], []])))
    b = from_header({**to_header(b, "f", None), "table_id": a.table_id}, files_table(b))
    assert fingerprint(a) != fingerprint(b)  # the same table id, rows and files but one


def test_row_ids_are_the_base_row_id_plus_the_position(tmp_path):
    from dataclasses import replace

    m, _ = split_manifest("train", train_snapshot(table(tmp_path / "t")))
    assert not m.row_tracking
    tracked = replace(
        m, files=tuple(replace(f, base_row_id=1000 * i) for i, f in enumerate(m.files))
    )
    ids = tracked.row_ids()
    assert len(ids) == m.rows
    assert set(ids[ids < 1000]) == set(m.files[0].positions().tolist())


def test_lineage_columns_are_parsed_and_each_named_once():
    from keras_dl.config import resolve
    from keras_dl.errors import ConfigError
    from keras_dl.recipe import load_recipe

    defaults = load_recipe("tabular").defaults
    exp = resolve(defaults, sets=["data.table=t", "data.lineage_columns=customer_id,region"])
    assert exp.data.lineage_columns == ("customer_id", "region")
    with pytest.raises(ConfigError, match="data.lineage_columns='customer_id,customer_id'"):
        resolve(defaults, sets=["data.table=t", "data.lineage_columns=customer_id,customer_id"])


def test_a_lineage_column_the_table_lacks_is_named(tmp_path):
    from keras_dl.errors import DataError

    with pytest.raises(DataError, match=r"data.lineage_columns \['nope'\] are not columns"):
        split_manifest("train", open_table(table(tmp_path / "t")), lineage_columns=["nope"])
