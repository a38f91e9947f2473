"""Data skipping: whether a file or a row group can hold a row that passes the filters.

A file is skipped by the statistics its table's log keeps (Delta's ``stats``: ``numRecords``,
``minValues``, ``maxValues``, ``nullCount``), a row group by its Parquet footer statistics,
before anything else of it is read. The answer is exact-safe: :func:`may_match` says False only
when the statistics prove that no row can pass, and True whenever they cannot say:

- a missing or unreadable statistic, a null count of wide bounds (``tightBounds`` false), a nested column, a type without an order: no proof;
- nulls never pass a filter (SQL), so a column that is null in every row passes nothing;
- NaN is not in floating-point statistics (Parquet leaves it out; a NaN bound is ignored), and a
  NaN row passes ``!=`` and ``not in``: those never skip floating-point columns;
- float32 statistics and filter values are compared as the column's float32 values, as the
  reader compares them (JSON statistics write a float32 as its shortest decimal);
- timestamps in Delta statistics are truncated to milliseconds: their bounds are widened by one;
- strings in Delta statistics are cut to a prefix: the log reader drops a maximum that may have
  been cut (:func:`keras_dl.data.tables.delta.file_stats`); a cut minimum is still a lower bound.

Statistics are keyed by the names inside the files (physical names under column mapping).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from keras_dl.data.tables.snapshot import Filter, TableSnapshot

_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Bounds:
    """What statistics say of one column in one file or row group (None: they do not say).

    Attributes:
        rows: Rows the file or row group holds.
        nulls: Null values of the column among them.
        low: A value at most every non-null (non-NaN) value of the column.
        high: A value at least every non-null (non-NaN) value of the column.
    """

    rows: int | None = None
    nulls: int | None = None
    low: Any = None
    high: Any = None


def may_match(op: str, value: Any, bounds: Bounds, kind: pa.DataType) -> bool:
    """False only when ``bounds`` prove that no row of ``kind`` passes ``column op value``."""
    if bounds.rows is not None and bounds.nulls is not None and bounds.nulls >= bounds.rows:
        return False  # every row is null (or there is none): a null passes no filter
    low, high = bounds.low, bounds.high
    floating = pa.types.is_floating(kind)
    try:
        if (
            floating and kind.bit_width < 64
        ):  # the reader compares the value cast to the column's type
            value = (
                [_narrow(v, kind) for v in value]
                if op in ("in", "not in")
                else _narrow(value, kind)
            )
        if op in ("!=", "not in"):
            if floating or low is None or high is None or low != high:
                return True  # a NaN row passes them; or the values differ
            return low != value if op == "!=" else low not in value
        if op == "=":
            return _inside(value, low, high)
        if op == "in":
            return any(_inside(v, low, high) for v in value)
        if op in ("<", "<="):
            return low is None or (low < value if op == "<" else low <= value)
        if op in (">", ">="):
            return high is None or (high > value if op == ">" else high >= value)
    except (TypeError, ValueError, ArithmeticError):
        return True  # values that do not compare prove nothing
    return True


def all_may_match(filters: Sequence[Filter], bounds_of, schema: pa.Schema) -> bool:
    """``may_match`` for every filter; ``bounds_of(column) -> Bounds``."""
    return all(
        may_match(op, value, bounds_of(col), schema.field(col).type) for col, op, value in filters
    )


def file_may_match(snapshot: TableSnapshot, index: int, filters: Sequence[Filter]) -> bool:
    """Whether file ``index`` can hold a row passing every filter, by its log statistics."""
    stats = snapshot.file_stats[index] if snapshot.file_stats else None
    if not stats:
        return True
    return all_may_match(filters, lambda col: log_bounds(snapshot, stats, col), snapshot.schema)


def group_may_match(
    snapshot: TableSnapshot, meta, row_group: int, stored: dict[str, str | None]
) -> bool:
    """Whether a row group can hold a row passing the snapshot's row filters, by its footer
    statistics; ``stored``: each filter column's name in the file (None if it lacks it)."""
    return all_may_match(
        snapshot.row_filters,
        lambda col: group_bounds(meta, row_group, stored.get(col), snapshot.schema.field(col).type),
        snapshot.schema,
    )


def log_bounds(snapshot: TableSnapshot, stats: dict, column: str) -> Bounds:
    """Bounds of logical ``column`` from one file's log statistics (keyed by physical name)."""
    name = snapshot.physical_field(column).name
    kind = snapshot.schema.field(column).type
    rows = stats.get("numRecords")
    # Wide bounds (tightBounds false, after a deletion vector) keep min and max valid bounds;
    # the null count is then only an estimate, so it proves nothing.
    wide = stats.get("tightBounds") is False
    nulls = None if wide else (stats.get("nullCount") or {}).get(name)
    low = to_bound((stats.get("minValues") or {}).get(name), kind, -1)
    high = to_bound((stats.get("maxValues") or {}).get(name), kind, +1)
    return Bounds(
        rows=rows if _count(rows) else None,
        nulls=nulls if _count(nulls) else None,
        low=low,
        high=high,
    )


def group_bounds(meta, row_group: int, stored: str | None, kind: pa.DataType) -> Bounds:
    """Bounds of a column (``stored``: its name in the file, None if the file lacks it) in one
    row group, from the Parquet footer ``meta``. Only top-level primitive columns have bounds."""
    group = meta.row_group(row_group)
    if stored is None:  # added to the table after the file was written: null in every row
        return Bounds(rows=group.num_rows, nulls=group.num_rows)
    for i in range(group.num_columns):
        chunk = group.column(i)
        if chunk.path_in_schema != stored:
            continue
        stats = chunk.statistics
        if stats is None:
            return Bounds()
        nulls = stats.null_count if stats.has_null_count else None
        if not stats.has_min_max or chunk.physical_type == "INT96":
            return Bounds(rows=group.num_rows, nulls=nulls)
        return Bounds(
            rows=group.num_rows,
            nulls=nulls,
            low=to_bound(stats.min, kind, -1),
            high=to_bound(stats.max, kind, +1),
        )
    return Bounds()  # a nested column: its leaves' statistics do not bound it


def to_bound(value: Any, kind: pa.DataType, side: int) -> Any:
    """A statistic as a value comparable to the filter values of ``kind`` (see
    :func:`keras_dl.data.tables.filters.to_type`), or None when it cannot be one. ``side``: -1 for a
    minimum, +1 for a maximum (timestamps widen by a millisecond that way)."""
    if value is None or isinstance(value, dict | list):
        return None
    try:
        if pa.types.is_integer(kind):
            return (
                int(value) if isinstance(value, int | str) and not isinstance(value, bool) else None
            )
        if pa.types.is_floating(kind):
            number = _narrow(float(value), kind)  # "0.1" in a float column is 0.1f
            return None if math.isnan(number) else number
        if pa.types.is_decimal(kind):
            number = Decimal(str(value))
            return None if number.is_nan() else number
        if pa.types.is_boolean(kind):
            return value if isinstance(value, bool) else None
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return value if isinstance(value, str) else None
        if pa.types.is_date(kind):
            if isinstance(value, datetime):
                return value.date()
            return value if isinstance(value, date) else date.fromisoformat(str(value)[:10])
        if pa.types.is_timestamp(kind):
            return _timestamp(value, kind) + side * _MS
    except (TypeError, ValueError, ArithmeticError, InvalidOperation, OverflowError):
        return None
    return None  # binary, nested and other types: no order the filters use


def _timestamp(value: Any, kind: pa.DataType) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    elif hasattr(value, "to_pydatetime"):  # a pandas Timestamp (nanosecond statistics)
        value = value.to_pydatetime(warn=False)
    if not isinstance(value, datetime):
        raise TypeError(value)
    if kind.tz is not None:
        aware = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return aware.astimezone(timezone.utc)
    if value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _narrow(number: float, kind: pa.DataType) -> float:
    """``number`` as the nearest value of a float32 or float16 column (a float64 is itself)."""
    if kind.bit_width == 64:
        return number
    import numpy as np

    return float(np.float32(number) if kind.bit_width == 32 else np.float16(number))


def _inside(value: Any, low: Any, high: Any) -> bool:
    return (low is None or low <= value) and (high is None or value <= high)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
