"""What a table's label column holds, read before training: for checks such as a classifier's
``model.num_classes`` against the labels, made before any run starts, and the class weights
(``train.class_weight``) counted on the training split.

Only the label column is read (column projection), from the same snapshot and with the same
``data.filters`` as training.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from keras_dl.config import DataConfig
from keras_dl.config.validate import parse_class_weight
from keras_dl.data.tables import open_table
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.training_rows import read_snapshot, read_table
from keras_dl.errors import ConfigError


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
    label = data.labels[0]
    if (
        snapshot.read_by_rows
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


def class_weights(
    data: DataConfig, entries: tuple[str, ...], train: TableSnapshot
) -> tuple[tuple, ...]:
    """``train.class_weight`` as ``(label, weight)`` pairs for the training split.

    "balanced" weighs each class ``n_rows / (n_classes * rows of the class)``, counted on the
    rows training reads: ``train``, the training split's snapshot (``data.filters`` applied,
    and with ``data.since_version`` only the changed rows); a mapping's keys must be labels of
    those rows.

    Raises:
        ConfigError: For a key that is not a label of the training split, naming it.
    """
    mode = parse_class_weight(entries)
    if mode is None:
        return ()
    counts = label_counts(train, data.labels[0])
    if mode == "balanced":
        n = sum(counts.values())
        return tuple((label, n / (len(counts) * c)) for label, c in sorted(counts.items()))
    by_text = {str(label): label for label in counts}
    unknown = [key for key in mode if key not in by_text]
    if unknown:
        raise ConfigError(
            f"train.class_weight names {', '.join(map(repr, unknown))}, which is not a label of "
            f"column {data.labels[0]!r} in the training rows of table {train.uri!r} (its labels: "
            f"{', '.join(sorted(by_text))}). Fix the key(s) in train.class_weight."
        )
    return tuple((by_text[key], weight) for key, weight in mode.items())


def label_counts(snapshot: TableSnapshot, label: str) -> dict:
    """Rows per value of ``label`` among the live rows of ``snapshot`` (nulls left out)."""
    values = read_snapshot(snapshot, columns=[label]).column(label)
    counts = pc.value_counts(pc.drop_null(values))
    return {c["values"]: c["counts"] for c in counts.to_pylist()}
