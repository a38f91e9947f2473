"""From a Spark ML DataFrame's columns to the one dense feature array a Keras model takes.

Vector columns (VectorAssembler and StandardScaler output), numeric arrays and numbers are
concatenated, in ``feature_cols`` order, into one ``array<float>`` per row. Everything that can
go wrong is checked here, before any data is written or any model built, and each error names
its column and the fix: a missing column, a non-numeric feature, nulls, vectors of different
sizes, and labels the loss cannot take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keras_dl.errors import DataError

FEATURES = "features"  # the columns of the materialized table
LABEL = "label"
SPLIT = "split"
WEIGHT = "sample_weight"

MULTICLASS, BINARY, REGRESSION = "multiclass", "binary", "regression"


@dataclass(frozen=True)
class FeatureLayout:
    """The width of each feature column and of their concatenation."""

    columns: tuple[str, ...]
    widths: tuple[int, ...]

    @property
    def width(self) -> int:
        return sum(self.widths)


def features_column(df, feature_cols: Sequence[str]):
    """One ``array<float>`` column: every feature column flattened and concatenated.

    Raises:
        DataError: For a missing or non-numeric feature column.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    check_present(df, feature_cols, "feature_cols")
    parts = []
    for name in feature_cols:
        t = df.schema[name].dataType
        col = _col(name)
        if _is_vector(t):
            parts.append(vector_to_array(col, "float32"))
        elif isinstance(t, T.ArrayType) and _numeric(t.elementType):
            parts.append(col.cast(T.ArrayType(T.FloatType())))
        elif _numeric(t):
            parts.append(F.array(col.cast(T.FloatType())))
        else:
            raise DataError(
                f"Feature column {name!r} is {t.simpleString()}, not numeric. Features must be "
                "vectors, numeric arrays or numbers: index strings with StringIndexer (and "
                "OneHotEncoder), then assemble them with VectorAssembler."
            )
    return parts[0] if len(parts) == 1 else F.concat(*parts)


def check_data(df, feature_cols: Sequence[str], label: str | None, task: str, classes: int):
    """Check the rows in one Spark job: nulls, vector sizes and labels.

    Args:
        df: The DataFrame to train on.
        feature_cols: Its feature columns.
        label: Its label column, or None when scoring.
        task: MULTICLASS, BINARY or REGRESSION (from the loss).
        classes: The model's output width (the number of classes for MULTICLASS).

    Returns:
        The :class:`FeatureLayout` of the features.

    Raises:
        DataError: Naming the column: nulls, vectors or arrays of different sizes, an empty
            DataFrame, or labels out of range for the loss.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    aggs = [F.count(F.lit(1)).alias("rows")]
    for i, name in enumerate(feature_cols):
        t, col = df.schema[name].dataType, _col(name)
        aggs.append(F.sum(col.isNull().cast("long")).alias(f"n{i}"))
        if _is_vector(t) or isinstance(t, T.ArrayType):
            size = F.size(vector_to_array(col) if _is_vector(t) else col)
            size = F.when(col.isNotNull(), size)
            aggs += [F.min(size).alias(f"lo{i}"), F.max(size).alias(f"hi{i}")]
    if label is not None:
        y = _col(label).cast("double")
        aggs += [
            F.sum(_col(label).isNull().cast("long")).alias("y_null"),
            F.min(y).alias("y_lo"),
            F.max(y).alias("y_hi"),
            F.sum((y != F.floor(y)).cast("long")).alias("y_frac"),
        ]
    stats = df.agg(*aggs).first().asDict()
    if not stats["rows"]:
        raise DataError("The DataFrame has no rows to train on.")
    widths = []
    for i, name in enumerate(feature_cols):
        if stats[f"n{i}"]:
            raise DataError(
                f"Feature column {name!r} has {stats[f'n{i}']} null value(s). Fill them "
                "(e.g. Imputer or fillna) or drop those rows before fitting."
            )
        lo, hi = stats.get(f"lo{i}", 1), stats.get(f"hi{i}", 1)
        if lo != hi:
            raise DataError(
                f"Feature column {name!r} holds vectors of different sizes ({lo} to {hi}). "
                "Every row needs the same size: build the column with one VectorAssembler, "
                "or pad the arrays."
            )
        widths.append(int(lo))
    if label is not None:
        _check_labels(label, stats, task, classes)
    return FeatureLayout(tuple(feature_cols), tuple(widths))


def check_present(df, columns: Sequence[str], param: str) -> None:
    """Raise a DataError naming the columns of ``param`` that ``df`` does not have."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(
            f"Column(s) {', '.join(repr(c) for c in missing)} named in {param} are not in the "
            f"DataFrame. Its columns: {', '.join(df.columns)}. Fix {param} or add the column."
        )


def check_label_type(df, label: str) -> None:
    """A label must be a number (class index or value).

    Raises:
        DataError: For a missing or non-numeric label column.
    """
    check_present(df, [label], "label_cols")
    t = df.schema[label].dataType
    if not _numeric(t):
        raise DataError(
            f"Label column {label!r} is {t.simpleString()}, not a number. Index string labels "
            "with StringIndexer (its output is the class index Spark ML's evaluators expect)."
        )


def check_weight_type(df, column: str) -> None:
    """A sample-weight column must be a number (``sample_weight_col``).

    Raises:
        DataError: For a missing or non-numeric weight column.
    """
    check_present(df, [column], "sample_weight_col")
    t = df.schema[column].dataType
    if not _numeric(t):
        raise DataError(
            f"Sample-weight column {column!r} (sample_weight_col) is {t.simpleString()}, not a "
            "number. Cast it to double, or drop sample_weight_col."
        )


def task_of(loss) -> str:
    """MULTICLASS, BINARY or REGRESSION, from a Keras loss name or instance."""
    name = loss if isinstance(loss, str) else getattr(loss, "name", type(loss).__name__)
    name = str(name).lower()
    if "sparse_categorical" in name or name == "categorical_crossentropy":
        return MULTICLASS
    if "binary" in name:
        return BINARY
    return REGRESSION


def _check_labels(label: str, stats: dict, task: str, classes: int) -> None:
    if stats["y_null"]:
        raise DataError(
            f"Label column {label!r} has {stats['y_null']} null value(s). Drop those rows "
            f"(df.dropna(subset=[{label!r}])) before fitting."
        )
    lo, hi = stats["y_lo"], stats["y_hi"]
    if task == MULTICLASS and (stats["y_frac"] or lo < 0 or hi >= classes):
        raise DataError(
            f"Label column {label!r} holds values from {lo:g} to {hi:g}, but the loss takes "
            f"class indexes 0 to {classes - 1} (the model has {classes} outputs). Index the "
            "labels with StringIndexer, or give the model as many outputs as classes."
        )
    if task == BINARY and (lo < 0 or hi > 1):
        raise DataError(
            f"Label column {label!r} holds values from {lo:g} to {hi:g}, but binary "
            "cross-entropy takes labels in [0, 1]. Index them to 0/1 or change the loss."
        )


def _col(name: str):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _is_vector(t) -> bool:
    from pyspark.sql import types as T

    return isinstance(t, T.UserDefinedType) and type(t).__name__ == "VectorUDT"


def _numeric(t) -> bool:
    from pyspark.sql import types as T

    return isinstance(t, (T.NumericType, T.BooleanType))
