"""Row filters written as text (``data.filters``) to typed ``(column, op, value)`` tuples.

``"year >= 2020"``, ``"country in US|FR"``, ``"split = train"``: the value is converted to the
column's type from the table schema, so ``year >= 2020`` compares numbers, also on a partition
column (whose values Delta and Hive store as path strings).

Example:
    >>> import pyarrow as pa
    >>> parse_filter("year >= 2020", pa.schema([("year", pa.int32())]))
    ('year', '>=', 2020)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from keras_dl.errors import DataError

_PATTERN = re.compile(r"^\s*([\w.]+)\s*(not in|in|==|!=|<=|>=|=|<|>)\s*(.*?)\s*$", re.IGNORECASE)


def parse_filters(texts: Sequence[str], schema: pa.Schema) -> list[tuple[str, str, Any]]:
    """Parse every ``"COLUMN OP VALUE"`` string; see :func:`parse_filter`."""
    return [parse_filter(t, schema) for t in texts]


def parse_filter(text: str, schema: pa.Schema) -> tuple[str, str, Any]:
    """``"COLUMN OP VALUE"`` -> ``(column, op, typed value)``; "in" values are split on "|".

    Raises:
        DataError: For text that is not a filter, or a column the schema lacks.
    """
    m = _PATTERN.match(text)
    if not m or not m.group(3):
        raise DataError(
            f"data.filters item {text!r} is not 'COLUMN OP VALUE' with OP one of = != < <= > >= "
            "in, not in (for example 'year >= 2020' or 'country in US|FR')."
        )
    col, op, raw = m.group(1), m.group(2).lower(), m.group(3)
    if col not in schema.names:
        raise DataError(
            f"data.filters column {col!r} is not in the table. Its columns: "
            f"{', '.join(schema.names)}."
        )
    kind = schema.field(col).type
    if op in ("in", "not in"):
        return col, op, [to_type(v.strip(), kind, col) for v in raw.split("|")]
    return col, "=" if op == "==" else op, to_type(raw, kind, col)


def to_type(value: Any, kind: pa.DataType, column: str) -> Any:
    """Convert a filter or partition value (often a string) to the Python type of ``kind``."""
    if value is None or not isinstance(value, str):
        return value
    if value == "" and not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None  # a null partition value
    try:
        if pa.types.is_integer(kind):
            return int(value)
        if pa.types.is_floating(kind):
            return float(value)
        if pa.types.is_boolean(kind):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
    except ValueError:
        raise DataError(
            f"Filter value {value!r} for column {column!r} is not a {kind} value."
        ) from None
    return value  # strings, dates and timestamps compare as their ISO text
