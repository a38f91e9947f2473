"""Packed features as named columns and back (numpy; see :func:`~keras_dl.data.stream.features.pack_features`).

A packed feature is several scalar columns of one dtype read as one ``(rows, k)`` array, its
column ``j`` the member ``j``: the reader (:func:`keras_dl.data.stream.arrays.to_arrays`) writes the
members straight into it; :func:`pack` does the same for columns already read one by one (a
Petastorm dataset's rows), and :func:`unpack` gives the named columns back (the logged model's
sample input). :func:`input_name` names a column's Keras input."""

from __future__ import annotations

import numpy as np

from keras_dl.data.stream.blocks import aligned
from keras_dl.data.stream.features import ColumnPlan


def pack(columns: dict, plan: ColumnPlan) -> dict:
    """``{column: array}`` with each packed feature's members replaced by its ``(rows, k)`` array."""
    out = dict(columns)
    for spec in plan.features:
        if spec.members:
            rows = len(columns[spec.members[0]])
            out[spec.name] = packed = aligned((rows, len(spec.members)), np.dtype(spec.dtype))
            for j, name in enumerate(spec.members):
                packed[:, j] = out.pop(name)
    return out


def unpack(values: dict, plan: ColumnPlan) -> dict:
    """``{name: array}`` with each packed feature split into its member columns, in plan order
    (features, then anything else ``values`` holds)."""
    out = {}
    for spec in plan.features:
        if spec.name not in values:
            continue
        if spec.members:
            for j, name in enumerate(spec.members):
                out[name] = values[spec.name][:, j]
        else:
            out[spec.name] = values[spec.name]
    features = {s.name for s in plan.features}
    return {**out, **{k: v for k, v in values.items() if k not in features}}


def input_name(column: str) -> str:
    """A Keras layer name for a column: Keras refuses "/" in names (Delta and Spark allow it)."""
    return column.replace("/", "∕") if "/" in column else column


def is_packed(plan: ColumnPlan) -> bool:
    """Whether any feature of ``plan`` is packed."""
    return any(s.members for s in plan.features)
