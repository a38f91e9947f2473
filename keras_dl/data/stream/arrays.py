"""One row group's planned columns as dense numpy arrays, and errors that name the row group.

:func:`to_arrays` turns a row group (a ``pyarrow.Table``) into ``{column: array}`` of the planned
dtypes and shapes, fixed-length lists without a Python loop, and refuses nulls. A list column
whose rows differ in length is named by file and row group (:func:`find_ragged` re-scans the
table), and so is such an error raised inside Petastorm (:func:`read_error`).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from keras_dl.data.stream.blocks import WEIGHT, aligned
from keras_dl.data.stream.features import NUMERIC, ColumnPlan, FeatureSpec
from keras_dl.data.tables.rows import load_row_group, one_array, open_file
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError


def to_arrays(
    table: pa.Table, plan: ColumnPlan, snapshot: TableSnapshot, where: str = ""
) -> dict[str, np.ndarray]:
    """One row group's planned columns as dense numpy arrays of their planned dtypes, and
    with a weight column or class weights, the rows' sample weights (``blocks.WEIGHT``).

    ``where`` names the file and row group in errors (", file 'x', row group 0")."""
    out = {}
    for spec in plan.specs:
        if spec.members:  # packed: the columns written straight into one (rows, k) array
            out[spec.name] = _packed(table, spec, snapshot)
            continue
        column = _column(table, spec.name, snapshot)
        if spec.kind != NUMERIC:
            out[spec.name] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
        elif spec.shape:
            out[spec.name] = _dense_lists(column, spec, snapshot)
        else:
            out[spec.name] = column.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    if plan.weighs_rows:
        out[WEIGHT] = row_weights(table, plan, snapshot, out, where)
    return out


def _packed(table: pa.Table, spec: FeatureSpec, snapshot: TableSnapshot) -> np.ndarray:
    """A packed feature's members as one ``(rows, k)`` array, row-major, member ``j`` in column
    ``j``. When every member already has the packed dtype, Arrow writes it (``to_tensor``,
    without the interpreter lock, so the reader's other threads run meanwhile: 10 % more rows/s
    on the bench's wide table at batch 256); otherwise numpy casts each member into place."""
    columns = [_column(table, name, snapshot) for name in spec.members]  # a null is refused
    dtype = np.dtype(spec.dtype)
    arrow_type = pa.from_numpy_dtype(dtype)
    if len(table) and all(c.type == arrow_type for c in columns):
        return np.asarray(table.select(list(spec.members)).to_tensor(row_major=True))
    packed = aligned((len(table), len(columns)), dtype)
    for j, column in enumerate(columns):
        packed[:, j] = column.to_numpy(zero_copy_only=False)
    return packed


def _column(table: pa.Table, name: str, snapshot: TableSnapshot) -> pa.Array:
    """One planned column as one Arrow array, refused when it holds a null."""
    column = table.column(name)
    if column.null_count:
        raise DataError(
            f"Column {name!r} of table {snapshot.uri!r} has {column.null_count} null "
            "value(s) in the rows read. Features and labels cannot be null: fill or drop "
            "those rows when writing the table, or leave the column out of data.features."
        )
    return one_array(column) if isinstance(column, pa.ChunkedArray) else column


def row_weights(table: pa.Table, plan: ColumnPlan, snapshot, arrays: dict, where: str = ""):
    """The rows' sample weights: the weight column (checked: no null, NaN, infinite or
    negative value) times the class weight of each row's label, as float32."""
    weights = np.ones(len(table), np.float32)
    if plan.weight is not None:
        name = plan.weight.name
        column = table.column(name)
        values = column.to_numpy(zero_copy_only=False) if not column.null_count else None
        bad = None
        if values is None:
            bad = f"{column.null_count} null value(s)"
        else:
            values = values.astype(np.float64)
            if not np.isfinite(values).all():
                bad = f"{int((~np.isfinite(values)).sum())} NaN or infinite value(s)"
            elif (values < 0).any():
                bad = f"{int((values < 0).sum())} negative value(s), e.g. {values.min():g}"
        if bad is not None:
            raise DataError(
                f"Column {name!r} (data.weight_column) of table {snapshot.uri!r}{where} has "
                f"{bad}. Sample weights must be finite numbers >= 0: fix those rows when "
                "writing the table, or filter them out with data.filters."
            )
        weights = values.astype(np.float32)
    if plan.class_weights:
        labels = arrays[plan.label.name]
        factor = np.ones(len(labels), np.float32)
        for label, weight in plan.class_weights:
            factor[labels == label] = weight
        weights = weights * factor
    return weights


def read_error(snapshot: TableSnapshot, exc: Exception) -> DataError:
    """Name the file and row group behind a reader error where that can be found."""
    m = re.search(r"values in column '([^']+)' are expected to be the same length", str(exc))
    if m:
        where = find_ragged(snapshot, m.group(1))
        if where:
            return _ragged_error(m.group(1), *where)
    return DataError(f"Reading table {snapshot.uri!r} failed: {exc}")


def find_ragged(snapshot: TableSnapshot, column: str):
    """``(file, row group, min length, max length)`` of the first ragged row group, or None."""
    import pyarrow.compute as pc

    for index, path in enumerate(snapshot.files):
        pf = open_file(snapshot, index)
        for rg in range(pf.num_row_groups):
            col = load_row_group(snapshot, index, pf, rg, [column]).column(0).combine_chunks()
            lengths = col.value_lengths()
            if len(lengths) and pc.min(lengths).as_py() != pc.max(lengths).as_py():
                return path, rg, pc.min(lengths).as_py(), pc.max(lengths).as_py()
    return None


def _dense_lists(column: pa.Array, spec: FeatureSpec, snapshot: TableSnapshot) -> np.ndarray:
    """A fixed-length list column as a (rows, *shape) array, without a Python loop."""
    import pyarrow.compute as pc

    size = int(np.prod(spec.shape))
    if pa.types.is_fixed_size_list(column.type):
        flat = column.flatten()
    else:
        lengths = column.value_lengths()
        if len(column) and (pc.min(lengths).as_py() != size or pc.max(lengths).as_py() != size):
            where = find_ragged(snapshot, spec.name)  # name the file and row group
            if where:
                raise _ragged_error(spec.name, *where)
            raise DataError(
                f"Column {spec.name!r} of table {snapshot.uri!r} has rows of shape "
                f"({pc.max(lengths)},) where {spec.shape} was expected (the lists differ in "
                "length between row groups). Pad them to one length when writing the table."
            )
        flat = column.flatten()
    if flat.null_count:
        raise DataError(
            f"List column {spec.name!r} of table {snapshot.uri!r} has null elements. Fill them "
            "when writing the table."
        )
    values = flat.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    return values.reshape((len(column), *spec.shape))


def _ragged_error(column, path, rg, lo, hi) -> DataError:
    return DataError(
        f"List column {column!r} has rows of different lengths ({lo} to {hi}) in file "
        f"{path!r}, row group {rg}. A feature needs a fixed shape: pad or truncate the lists "
        "when writing the table, or drop the column."
    )
