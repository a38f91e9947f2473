"""keras_dl.erasure.mark on a Delta table on disk (no training): the predicate's fingerprint, the
table version that removed the rows, and the refusal while rows still match."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pytest

from keras_dl.erasure import mark
from keras_dl.errors import DataError
from tests.conftest import write_test_table


def test_the_fingerprint_is_of_the_normalized_predicate():
    fp = mark.predicate_fingerprint(["customer_id  =   42", "day >= 3"])
    assert fp == hashlib.sha256(b"customer_id = 42 AND day >= 3").hexdigest()
    assert fp == mark.predicate_fingerprint(["day >= 3", "customer_id = 42"])
    assert mark.normalized(row_ids=[9, 7, 7]) == "row_ids IN (7,9)"


def test_the_version_that_removed_the_rows(tmp_path):
    from deltalake import DeltaTable

    table = str(tmp_path / "t")
    write_test_table(table, pa.table({"customer_id": [41, 42, 42, 43]}), rows_per_group=2)
    where = ["customer_id = 42"]
    with pytest.raises(DataError, match=r"version 0 still has 2 row\(s\) where customer_id = 42"):
        mark.check_erased(table, where)
    DeltaTable(table).delete("customer_id = 41")  # version 1: other rows
    DeltaTable(table).delete("customer_id = 42")  # version 2: the erasure
    DeltaTable(table).delete("customer_id = 43")  # version 3
    assert mark.check_erased(table, where) == 3
    assert mark.matching_rows(table, where, 1) == 2
    assert mark.removal_version(table, where, 0, 3) == (2, mark.FIRST)
    assert mark.removal_version(table, where, None, 3) == (3, mark.CURRENT)
    assert mark.removal_version(table, [], 0, 3) == (3, mark.CURRENT)  # row ids
    assert mark.removal_version(table, where, 0, 3, most=2) == (3, mark.CURRENT)
    value = json.loads(mark.tag_value("ab", table, 2, mark.FIRST))
    assert value == {
        "predicate_sha256": "ab",
        "table": table,
        "removed_in_version": 2,
        "removed_in": mark.FIRST,
    }
