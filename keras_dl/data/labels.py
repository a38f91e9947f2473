"""What a table's label column holds, read before training: for checks such as a classifier's
``model.num_classes`` against the labels, made before any run starts.

Only the label column is read (column projection), from the same snapshot and with the same
``data.filters`` as training.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from keras_dl.config import DataConfig
from keras_dl.data.read import read_table
from keras_dl.data.tables import open_table


@dataclass(frozen=True)
class LabelRange:
    """The integer labels of one table: the smallest, the largest and how many distinct."""

    table: str
    column: str
    low: int
    high: int
    distinct: int


def integer_label_range(
    data: DataConfig, table: str, version: int | None = None, timestamp: str | None = None
) -> LabelRange | None:
    """The range of ``data.label`` in ``table`` (nulls left out, ``data.filters`` applied).

    Returns:
        None when the label is not an integer column of a Delta or Parquet table, or has no
        values: training reports a missing or unusable label itself.
    """
    snapshot = open_table(table, version, timestamp, data.trust_petastorm_metadata)
    label = data.label
    if (
        snapshot.format == "petastorm"
        or label not in snapshot.schema.names
        or not pa.types.is_integer(snapshot.schema.field(label).type)
    ):
        return None
    values = read_table(
        table, version, timestamp, columns=[label], filters=data.filters or None
    ).column(label)
    values = pc.drop_null(values)
    if len(values) == 0:
        return None
    extremes = pc.min_max(values)
    return LabelRange(
        table=snapshot.uri,
        column=label,
        low=extremes["min"].as_py(),
        high=extremes["max"].as_py(),
        distinct=pc.count_distinct(values).as_py(),
    )
