"""The erasure's mark on a version: ``keras_dl.trained_on_erased_rows``, and where the rows went.

The tag's value is a short JSON: the predicate's fingerprint (SHA-256 of its normalized text,
never the text itself, which may name a person), the table, and the table version that removed
the rows: the first version after the one trained on where no row of the table matches, found by
reading the predicate's columns at each version (at most :data:`MAX_SEARCH` of them), or else
the current version, and ``removed_in`` says which of the two it is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from keras_dl.data.tables import open_table
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.errors import DataError, KerasDLError
from keras_dl.lineage.file_rows import trained_runs

ERASED_TAG = "keras_dl.trained_on_erased_rows"
MAX_SEARCH = 20  # versions read to find the one that removed the rows; beyond: the current one
FIRST = "first version without them"
CURRENT = "current version (the first one without them was not searched for)"


def normalized(where: Sequence[str] = (), row_ids: Sequence[int] = ()) -> str:
    """The request as one text: predicates with single spaces, sorted, ANDed; or row ids."""
    if row_ids:
        return "row_ids IN (" + ",".join(str(i) for i in sorted(set(row_ids))) + ")"
    return " AND ".join(sorted(" ".join(w.split()) for w in where))


def predicate_fingerprint(where: Sequence[str] = (), row_ids: Sequence[int] = ()) -> str:
    """SHA-256 (hex) of :func:`normalized`: the same request gives the same fingerprint."""
    return hashlib.sha256(normalized(where, row_ids).encode()).hexdigest()


def matching_rows(table: str, where: Sequence[str], version: int | None = None) -> int:
    """Rows of ``table`` (at ``version``, default the latest) matching every predicate."""
    snapshot = open_table(table, version)
    snapshot = select(snapshot, parse_filters(list(where), snapshot.schema))
    total = 0
    for i in range(len(snapshot.files)):
        found, _ = trained_runs(snapshot, i)
        total += int((found[:, 1] - found[:, 0]).sum()) if len(found) else 0
    return total


def removal_version(
    table: str, where: Sequence[str], trained: int | None, current: int, most: int = MAX_SEARCH
) -> tuple[int, str]:
    """``(version, how)``: the first version after ``trained`` where no row matches ``where``
    (``how`` is :data:`FIRST`), or ``current`` (:data:`CURRENT`) when it was not searched
    (row ids, no trained version, more than ``most`` versions to read, or a version
    whose files VACUUM removed)."""
    if not where or trained is None or current - trained > most:
        return current, CURRENT
    for version in range(trained + 1, current + 1):
        try:
            if matching_rows(table, where, version) == 0:
                return version, FIRST
        except KerasDLError:  # that version's files were vacuumed: not searched further
            return current, CURRENT
    return current, CURRENT


def check_erased(table: str, where: Sequence[str]) -> int:
    """The table's current version, after checking no row still matches ``where``.

    Raises:
        DataError: Rows still match: retraining now would train on them again.
    """
    current = open_table(table).version
    if where:
        left = matching_rows(table, where)
        if left:
            raise DataError(
                f"Table {table!r} at version {current} still has {left} row(s) where "
                f"{' AND '.join(where)}: a model retrained now would train on them again. "
                "Delete them first (DELETE FROM ... WHERE ..., or deltalake's "
                "DeltaTable(path).delete(predicate)), then run keras-dl retrain-without again."
            )
    return current


def tag_value(fingerprint: str, table: str, version: int, how: str) -> str:
    """The tag's JSON text (sorted keys, no spaces)."""
    value = {"predicate_sha256": fingerprint, "table": table, "removed_in_version": version}
    value["removed_in"] = how
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
