"""Plan which columns become which tensors, from a table's schema, before any row is read.

Every check that can be done from the schema and Parquet footers happens here, so a bad column
stops the run in seconds with a message that names it: missing columns, non-numeric features,
nulls (from the footer statistics) and list columns without a fixed length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError

NUMERIC = "numeric"
STRING = "string"
BINARY = "binary"


@dataclass(frozen=True)
class FeatureSpec:
    """One column as a tensor: its numpy dtype and per-row shape (``()`` for a scalar).

    A packed feature (:mod:`keras_dl.data.stream.packing`) is several scalar columns of one dtype as
    one ``(len(members),)`` tensor: ``members`` are those columns, in order; ``name`` is not a
    column of the table."""

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    kind: str = NUMERIC
    members: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """The table columns this tensor is read from."""
        return self.members or (self.name,)


@dataclass(frozen=True)
class ColumnPlan:
    """The feature and label columns of a dataset, in model-input order, and how rows weigh.

    ``labels`` holds one spec per output head (``data.label`` may name several columns);
    ``label`` is the first, or None for unlabeled data. ``weight`` is the sample-weight column (``data.weight_column``): read with the features,
    never a model input. ``class_weights`` are ``(label, weight)`` pairs
    (``train.class_weight``), multiplied with the weight column when both are set.
    """

    features: tuple[FeatureSpec, ...]
    labels: tuple[FeatureSpec, ...] = ()
    weight: FeatureSpec | None = None
    class_weights: tuple[tuple, ...] = ()

    @property
    def label(self) -> FeatureSpec | None:
        """The (first) label's spec, or None for unlabeled data."""
        return self.labels[0] if self.labels else None

    @property
    def heads(self) -> bool:
        """Several labels: the model has one named output per label."""
        return len(self.labels) > 1

    @property
    def columns(self) -> list[str]:
        """The columns read: the features, the label and the weight column."""
        read = [c for s in self.specs for c in s.columns]
        return read + ([self.weight.name] if self.weight else [])

    @property
    def weighs_rows(self) -> bool:
        """Rows carry their own sample weights (a weight column or class weights)."""
        return self.label is not None and (self.weight is not None or bool(self.class_weights))

    @property
    def specs(self) -> list[FeatureSpec]:
        """The features' specs, then the labels'."""
        return list(self.features) + list(self.labels)


def plan_columns(
    snapshot: TableSnapshot,
    features: Sequence[str] = (),
    label: str | Sequence[str] | None = "label",
    exclude: Sequence[str] = (),
    accept: Sequence[str] = (NUMERIC,),
    weight: str | None = None,
    pack: bool = False,
) -> ColumnPlan:
    """Choose and type-check the feature and label columns of ``snapshot``.

    Args:
        snapshot: The table to read.
        features: Feature columns; empty means all columns except the label, the partition
            columns and ``exclude``. Defaults to ().
        label: Label column, several (one output head each), or None for unlabeled data.
            Defaults to "label".
        exclude: Columns never used as features (for example the split column). Defaults to ().
        accept: Feature kinds the recipe can consume: "numeric", "string", "binary".
            Defaults to numeric only.
        weight: The sample-weight column (never a feature), or None. Defaults to None.
        pack: Read the scalar numeric features of each dtype (two or more) as one packed
            ``(k,)`` tensor (:func:`pack_features`). Defaults to False.

    Raises:
        DataError: For a missing column, a column of a kind the recipe does not accept, or a
            list column whose rows have different lengths.
    """
    schema = snapshot.schema
    names = list(schema.names)
    labels = [label] if isinstance(label, str) else list(label or ())
    absent = [c for c in labels if c not in names]
    if absent:
        raise DataError(_missing(snapshot, absent, "data.label"))
    if len(set(labels)) < len(labels) or set(labels) & set(features):
        raise DataError(
            f"data.label={labels} names a column twice or a column of data.features in table "
            f"{snapshot.uri!r}: each label is one output head, never a model input. List "
            "each label once, and not among the features."
        )
    if weight is not None and weight not in names:
        raise DataError(_missing(snapshot, [weight], "data.weight_column"))
    if weight is not None and (weight in labels or weight in features):
        raise DataError(
            f"data.weight_column={weight!r} is also the label or a feature of table "
            f"{snapshot.uri!r}. A weight column is never a model input: name another column."
        )
    if features:
        missing = [f for f in features if f not in names]
        if missing:
            raise DataError(_missing(snapshot, missing, "data.features"))
        chosen = list(features)
    else:
        skip = {*labels, weight, *snapshot.partition_columns, *exclude}
        chosen = [n for n in names if n not in skip]
        if not chosen:
            raise DataError(
                f"Table {snapshot.uri!r} has no feature column besides {', '.join(labels)}."
            )
    if snapshot.unischema is not None:  # a Petastorm dataset: its Unischema knows the shapes

        def spec_of(name, kinds, role):
            return _unischema_spec(snapshot, name, kinds, role)
    else:

        def spec_of(name, kinds, role):
            return _spec(snapshot, schema.field(name), kinds, role)

    specs = tuple(spec_of(n, accept, "feature") for n in chosen)
    label_specs = tuple(spec_of(c, (NUMERIC, STRING), "label") for c in labels)
    weight_spec = None
    if weight is not None:
        weight_spec = spec_of(weight, (NUMERIC,), "sample weight (data.weight_column)")
        if weight_spec.shape:
            raise DataError(
                f"data.weight_column={weight!r} of table {snapshot.uri!r} is a list column "
                f"(shape {weight_spec.shape}): a sample weight is one number per row."
            )
    if pack:
        specs = pack_features(specs, names, snapshot.uri)
    return ColumnPlan(specs, label_specs, weight_spec)


PACKED = "__packed_"  # a packed feature's name: this and its dtype, e.g. "__packed_float32"


def pack_features(
    specs: Sequence[FeatureSpec], columns: Sequence[str], table: str = ""
) -> tuple[FeatureSpec, ...]:
    """``specs`` with the scalar integer and float features of each dtype, when there are two
    or more, replaced by one packed feature ``__packed_<dtype>`` of shape ``(k,)`` at the place
    of its first member; lists, strings, binary, booleans and a dtype's lone column stay as they
    are. Labels and the weight column are never passed here, so they never pack.

    Raises:
        DataError: A column of the table (``columns``) has a name starting with ``__packed_``.
    """
    groups: dict[str, list[str]] = {}
    for s in specs:
        if s.kind == NUMERIC and not s.shape and not s.members and np.dtype(s.dtype).kind in "iuf":
            groups.setdefault(s.dtype, []).append(s.name)
    packed = {dtype: members for dtype, members in groups.items() if len(members) > 1}
    clash = [c for c in columns if c.startswith(PACKED)]
    if packed and clash:
        raise DataError(
            f"Table {table!r} has a column named {clash[0]!r}: names starting with {PACKED!r} "
            "are kept for packed features (and the layers that build them). Rename that "
            "column when writing the table, or turn packing off "
            "(--set data.pack_features=false)."
        )
    out, placed = [], set()
    for s in specs:
        group = packed.get(s.dtype) if s.name in packed.get(s.dtype, ()) else None
        if group is None:
            out.append(s)
        elif s.dtype not in placed:
            placed.add(s.dtype)
            out.append(FeatureSpec(PACKED + s.dtype, s.dtype, (len(group),), NUMERIC, tuple(group)))
    return tuple(out)


def _spec(
    snapshot: TableSnapshot, field: pa.Field, accept: Sequence[str], role: str
) -> FeatureSpec:
    t = field.type
    shape: tuple[int, ...] = ()
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            shape += (t.list_size,)
        else:
            shape += (_list_length(snapshot, field.name, len(shape)),)
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        kind, dtype = NUMERIC, np.dtype(t.to_pandas_dtype()).name
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        kind, dtype = STRING, "string"
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        kind, dtype = BINARY, "binary"
    else:
        kind, dtype = "unsupported", str(t)
    if kind not in accept:
        raise DataError(
            f"Column {field.name!r} of table {snapshot.uri!r} has type {field.type}, which this "
            f"recipe cannot use as a {role} (it accepts {', '.join(accept)} columns). "
            + (
                "Point data.weight_column at a numeric column, or cast it when writing the table."
                if role.startswith("sample weight")
                else "Drop it from data.features, or convert it to a number when writing the table."
            )
        )
    if len(shape) > 1:
        raise DataError(
            f"Column {field.name!r} of table {snapshot.uri!r} is a nested list (shape {shape}), "
            "which Petastorm's reader cannot read. Store it flattened, as one list of "
            f"{int(np.prod(shape))} values, and reshape it in the model or the preprocess hook."
        )
    if kind != NUMERIC and shape:
        raise DataError(f"Column {field.name!r}: lists of {kind} values are not supported.")
    return FeatureSpec(field.name, dtype, shape, kind)


def _list_length(snapshot: TableSnapshot, column: str, depth: int) -> int:
    """The length of a list column's rows, taken from the first non-empty row group."""
    from keras_dl.data.tables.rows import load_row_group, open_file

    for index, path in enumerate(snapshot.files):
        pf = open_file(snapshot, index)
        for rg in range(pf.num_row_groups):
            col = load_row_group(snapshot, index, pf, rg, [column]).column(0).combine_chunks()
            for _ in range(depth):
                col = col.flatten()
            lengths = col.value_lengths() if len(col) else pa.array([], pa.int32())
            if len(lengths) == 0:
                continue
            lo, hi = pa.compute.min(lengths).as_py(), pa.compute.max(lengths).as_py()
            if lo != hi:
                raise DataError(
                    f"List column {column!r} has rows of different lengths ({lo} to {hi}) in "
                    f"file {path!r}, row group {rg}. A feature needs a fixed shape: pad or "
                    "truncate the lists when writing the table, or drop the column."
                )
            return int(lo)
    raise DataError(f"List column {column!r} of table {snapshot.uri!r} has no rows.")


def _missing(snapshot: TableSnapshot, missing: list[str], key: str) -> str:
    return (
        f"Column(s) {', '.join(repr(m) for m in missing)} named in {key} are not in table "
        f"{snapshot.uri!r}. The table has these columns: {', '.join(snapshot.schema.names)}. "
        f"Fix {key} (for example --set {key}=<column>)."
    )


def _unischema_spec(snapshot, name: str, accept, role: str):
    """A FeatureSpec for a Unischema field: dtype and shape from the schema, not the bytes."""
    field = snapshot.unischema.fields[name]
    dtype = np.dtype(field.numpy_dtype)
    shape = tuple(field.shape)
    if any(d is None for d in shape):
        raise DataError(
            f"Field {name!r} of Petastorm dataset {snapshot.uri!r} has a variable shape {shape}: "
            "a feature needs a fixed shape. Re-materialize it with a fixed shape."
        )
    if dtype.kind in "iufb":
        kind, name_dtype = NUMERIC, dtype.name
    elif dtype.kind == "U":
        kind, name_dtype = STRING, "string"
    elif dtype.kind == "S":
        kind, name_dtype = BINARY, "binary"
    else:
        kind, name_dtype = "unsupported", str(dtype)
    if kind not in accept:
        raise DataError(
            f"Field {name!r} of Petastorm dataset {snapshot.uri!r} is {dtype}{list(shape)}, which "
            f"this recipe cannot use as a {role} (it accepts {', '.join(accept)})."
        )
    return FeatureSpec(name, name_dtype, shape, kind)
