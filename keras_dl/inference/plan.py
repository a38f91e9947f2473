"""The scoring plan: a model signature matched to a DataFrame's columns, and the output schema.

Runs on the driver, before any scoring: a table that does not fit the model fails here, listing
the columns the model expects and the columns found. The plan is plain data, so it pickles to
the executors (:mod:`keras_dl.inference.executor`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keras_dl.errors import DataError


@dataclass(frozen=True)
class ScoringPlan:
    """What the UDF needs, all plain data so it pickles to the executors.

    Attributes:
        model_file: Name of the model folder's archive, shipped with :func:`keras_dl.connect.ship_folder`.
        inputs: ``(column, dtype, width)`` per model input; width is None for scalar columns.
        frame: Whether the model takes a DataFrame of columns (column signature) rather than
            arrays (tensor signature).
        named: Whether a tensor-signature model takes a dict keyed by input name.
        keys: Columns copied through to the output.
        classes: Class labels, when the model classifies and the run recorded them.
        keras_flavor: Whether the model has MLflow's Keras flavor (scored by a direct call).
        heads: ``(output, classes)`` per output head of a several-label model, in signature
            order (classes empty for a regression head); empty for one output.
    """

    model_file: str
    inputs: tuple[tuple[str, str, int | None], ...]
    frame: bool
    named: bool
    keys: tuple[str, ...]
    classes: tuple = ()
    keras_flavor: bool = False
    heads: tuple[tuple[str, tuple], ...] = ()


def make_plan(df, signature, model_uri: str, features: list[str], keys) -> ScoringPlan:
    """Match the DataFrame's columns to the model signature, or fail listing both."""
    from pyspark.sql import types as T

    found = {f.name: f.dataType for f in df.schema.fields}
    frame = not signature.inputs.is_tensor_spec()  # a column signature: a DataFrame model
    specs = signature.inputs.inputs
    if frame:
        wanted = [(s.name, s.type.to_numpy().name, None) for s in specs]
    else:
        names = [s.name for s in specs]
        if len(specs) == 1 and not names[0]:
            if len(features) != 1:
                raise DataError(
                    f"Model {model_uri} takes one unnamed tensor {specs[0].shape}; say which "
                    f"column holds it with --features COLUMN (found columns: {', '.join(found)})."
                )
            names = features
        wanted = [
            (n, s.type.name, s.shape[1] if len(s.shape) > 1 else None) for n, s in zip(names, specs)
        ]
    missing = [c for c, _, _ in wanted if c not in found]
    wrong = [
        c
        for c, _, width in wanted
        if c in found and isinstance(found[c], T.ArrayType) != (width is not None)
    ]
    if missing or wrong:
        expected = ", ".join(f"{c} ({d}{f'[{w}]' if w else ''})" for c, d, w in wanted)
        got = ", ".join(f"{n} ({t.simpleString()})" for n, t in found.items())
        raise DataError(
            f"The rows do not match the input of model {model_uri}: "
            f"{'missing ' + ', '.join(missing) if missing else ''}"
            f"{'; wrong shape: ' + ', '.join(wrong) if wrong else ''}. Expected columns: "
            f"{expected}. Found columns: {got}. Score a table with those columns, or rename "
            "them (or pass --features for a single-tensor model)."
        )
    inputs = {c for c, _, _ in wanted}
    if keys is None:
        keys = [
            n
            for n, t in found.items()
            if n not in inputs and not isinstance(t, (T.ArrayType, T.MapType, T.BinaryType))
        ]
    absent = [k for k in keys if k not in found]
    if absent:
        raise DataError(
            f"Key column(s) {', '.join(absent)} not found; columns: {', '.join(found)}."
        )
    return ScoringPlan("", tuple(wanted), frame, len(specs) > 1 or bool(specs[0].name), tuple(keys))


def output_width(signature) -> int:
    shape = signature.outputs.inputs[0].shape if signature.outputs else (-1, 1)
    return int(shape[1]) if len(shape) > 1 else 1


def output_schema(df, plan: ScoringPlan, width: int):
    """The key columns, then ``prediction`` (and ``probability_<class>`` for a classifier);
    for several heads, ``prediction_<head>`` (and ``probability_<head>_<class>``) per head."""
    from pyspark.sql import types as T

    fields = [df.schema[k] for k in plan.keys]
    for head, classes in plan.heads:
        fields.append(T.StructField(f"prediction_{head}", _class_type(classes)))
        fields += [T.StructField(c, T.FloatType()) for c in head_columns(head, classes)]
    if plan.heads:
        return T.StructType(fields)
    if width > 1:
        first = plan.classes[0] if plan.classes else 0
        kind = (
            T.StringType()
            if isinstance(first, str)
            else T.BooleanType()
            if isinstance(first, bool)
            else T.LongType()
        )
        fields.append(T.StructField("prediction", kind))
        fields += [T.StructField(c, T.FloatType()) for c in probability_columns(plan, width)]
    else:
        fields.append(T.StructField("prediction", T.DoubleType()))
    return T.StructType(fields)


def head_columns(head: str, classes: tuple) -> list[str]:
    """A classifier head's probability columns (none for a regression head)."""
    return [f"probability_{head}_{re.sub(r'[^0-9A-Za-z_]', '_', str(n))}" for n in classes]


def _class_type(classes: tuple):
    from pyspark.sql import types as T

    if not classes:
        return T.DoubleType()
    first = classes[0]
    if isinstance(first, str):
        return T.StringType()
    return T.BooleanType() if isinstance(first, bool) else T.LongType()


def probability_columns(plan: ScoringPlan, width: int) -> list[str]:
    names = plan.classes if len(plan.classes) == width else range(width)
    return [f"probability_{re.sub(r'[^0-9A-Za-z_]', '_', str(n))}" for n in names]
