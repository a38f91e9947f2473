"""Row filters: from text (``data.filters``) to typed ``(column, op, value)``, and applied.

``"year >= 2020"``, ``"country in US|FR"``, ``"split = train"``: the value is converted to the
column's type from the table schema, so ``year >= 2020`` compares numbers and ``day >= 2024-01-01``
compares dates, on partition and data columns alike. Filters follow SQL: a null never matches.

:func:`select` narrows a snapshot: filters on partition columns drop whole files (the values
are typed in the snapshot), filters on other columns drop the files whose log statistics prove
that no row matches (:mod:`keras_dl.data.tables.skipping`), and are kept on the snapshot: row groups
are skipped by their footer statistics and the rest filtered row by row as they are read
(:func:`row_mask`), so counts, steps and the rows read always agree.

Example:
    >>> import pyarrow as pa
    >>> parse_filter("year >= 2020", pa.schema([("year", pa.int32())]))
    ('year', '>=', 2020)
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa

from keras_dl.data.tables.skipping import file_may_match
from keras_dl.data.tables.snapshot import Filter, TableSnapshot
from keras_dl.errors import DataError

OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")
# A column may hold spaces, dots, slashes or any character Delta allows: quote it in backticks
# when it holds " in " or an operator. Word operators need spaces around them ("tin = 3").
_QUOTED = re.compile(r"^\s*`([^`]+)`\s*(not\s+in\s|in\s|==|!=|<=|>=|=|<|>)\s*(.*?)\s*$", re.I)
_WORD = re.compile(r"^\s*(.+?)\s+(not\s+in|in)\s+(.*?)\s*$", re.IGNORECASE)
_SYMBOL = re.compile(r"^\s*(.+?)\s*(==|!=|<=|>=|=|<|>)\s*(.*?)\s*$")


def parse_filters(texts: Sequence[str], schema: pa.Schema) -> list[Filter]:
    """Parse every ``"COLUMN OP VALUE"`` string; see :func:`parse_filter`."""
    return [parse_filter(t, schema) for t in texts]


def parse_filter(text: str, schema: pa.Schema) -> Filter:
    """``"COLUMN OP VALUE"`` -> ``(column, op, typed value)``; "in" values are split on "|".

    Raises:
        DataError: For text that is not a filter, or a column the schema lacks.
    """
    m = _QUOTED.match(text) or _WORD.match(text) or _SYMBOL.match(text)
    if not m or not m.group(3):
        raise DataError(
            f"data.filters item {text!r} is not 'COLUMN OP VALUE' with OP one of = != < <= > >= "
            "in, not in (for example 'year >= 2020' or 'country in US|FR')."
        )
    col, op, raw = m.group(1), " ".join(m.group(2).lower().split()), m.group(3)
    if col not in schema.names:
        raise DataError(
            f"data.filters column {col!r} is not in the table. Its columns: "
            f"{', '.join(schema.names)}."
        )
    kind = schema.field(col).type
    if op in ("in", "not in"):
        return col, op, [to_type(v.strip(), kind, col) for v in raw.split("|")]
    return col, "=" if op == "==" else op, to_type(raw, kind, col)


def filter_column(text: str) -> str | None:
    """The column a ``"COLUMN OP VALUE"`` filter names, or None for text that is not one."""
    m = _QUOTED.match(text) or _WORD.match(text) or _SYMBOL.match(text)
    return m.group(1) if m else None


def select(snapshot: TableSnapshot, filters: Sequence[Filter]) -> TableSnapshot:
    """Keep the rows matching every ``(column, op, value)`` filter.

    Files are dropped only where their partition values or log statistics prove that none of
    their rows matches; ``skipped_files`` counts those the statistics dropped.

    Raises:
        DataError: For a column the table lacks or an unknown operator.
    """
    keep = list(range(len(snapshot.files)))
    row_filters = []
    for col, op, value in filters:
        if col not in snapshot.schema.names:
            raise DataError(
                f"Filter column {col!r} is not in table {snapshot.uri!r}. Its columns are: "
                f"{', '.join(snapshot.schema.names)}."
            )
        if op not in OPS:
            raise DataError(f"Filter operator {op!r} on {col!r} is not one of {', '.join(OPS)}.")
        op = "=" if op == "==" else op
        kind = snapshot.schema.field(col).type
        typed = (
            [to_type(v, kind, col) for v in value] if _is_list(value) else to_type(value, kind, col)
        )
        if col in snapshot.partition_columns:
            keep = [i for i in keep if _matches(snapshot.partitions[i].get(col), op, typed)]
        else:
            row_filters.append((col, op, typed))
    skipped = 0
    if row_filters and snapshot.file_stats and snapshot.data_skipping:
        before = len(keep)
        keep = [i for i in keep if file_may_match(snapshot, i, row_filters)]
        skipped = before - len(keep)
    narrowed = snapshot.take(keep)
    return replace(
        narrowed,
        row_filters=snapshot.row_filters + tuple(row_filters),
        skipped_files=snapshot.skipped_files + skipped,
    )


def row_mask(table: pa.Table, filters: Sequence[Filter]) -> pa.BooleanArray | None:
    """The rows of ``table`` that pass every filter (None when there is no filter)."""
    import pyarrow.compute as pc

    mask = None
    for col, op, value in filters:
        column = table.column(col)
        if op in ("in", "not in"):
            m = pc.is_in(column, value_set=pa.array(list(value), type=column.type))
            m = pc.invert(m) if op == "not in" else m
            m = pc.and_(m, pc.is_valid(column))
        else:
            fn = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal}.get(op)
            fn = fn or {">": pc.greater, ">=": pc.greater_equal}[op]
            m = fn(column, pa.scalar(value, type=column.type))
        m = pc.fill_null(m, False)  # SQL: a null compares to nothing
        mask = m if mask is None else pc.and_(mask, m)
    return mask


def to_type(value: Any, kind: pa.DataType, column: str) -> Any:
    """Convert a filter or partition value (often a string) to the Python type of ``kind``.

    Raises:
        DataError: For a value that is not of that type.
    """
    if not isinstance(value, str):
        return value
    try:
        if pa.types.is_integer(kind):
            return int(value)
        if pa.types.is_floating(kind):
            return float(value)
        if pa.types.is_decimal(kind):
            return Decimal(value)
        if pa.types.is_boolean(kind):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if pa.types.is_date(kind):
            return date.fromisoformat(value)
        if pa.types.is_timestamp(kind):
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if kind.tz is not None and stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=timezone.utc)  # naive times are UTC, as Spark's
            if kind.tz is None and stamp.tzinfo is not None:
                stamp = stamp.astimezone(timezone.utc).replace(tzinfo=None)
            return stamp
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            return value.encode("utf-8")  # as Delta reads binary partition values
    except (ValueError, ArithmeticError):
        raise DataError(
            f"Value {value!r} for column {column!r} is not a {kind} value. Write it as the "
            "column's type (numbers as digits, dates as YYYY-MM-DD, timestamps as ISO 8601)."
        ) from None
    return value


def _matches(actual: Any, op: str, value: Any) -> bool:
    if actual is None:
        return False  # SQL: a null partition value matches no filter
    if op == "in":
        return actual in value
    if op == "not in":
        return actual not in value
    return _COMPARE[op](actual, value)


_COMPARE = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, set, frozenset))
