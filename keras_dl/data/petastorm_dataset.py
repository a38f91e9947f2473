"""Existing Petastorm datasets (a Unischema with codecs, written by ``materialize_dataset``).

Users who already have Petastorm data read it as it is: the dataset's Unischema gives each
column's dtype and shape, and Petastorm's row reader (``make_reader``) decodes the codecs
(images, ndarrays). Rows are then stacked into dense chunks, so the rest of the data path
(rebatch, preprocess, prefetch) is the same as for Delta and Parquet. ``make_reader`` is
row-based, so this path is slower than a plain table: for speed, re-ingest the images as
encoded bytes and decode them in tf.data (``keras_dl.data.images``).
"""

from __future__ import annotations

import os

import numpy as np

from keras_dl.errors import DataError

_UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"


def is_petastorm_dataset(path: str) -> bool:
    """True for a local Parquet folder whose ``_common_metadata`` holds a Unischema."""
    meta = os.path.join(path, "_common_metadata")
    if not os.path.isfile(meta):
        return False
    import pyarrow.parquet as pq

    try:
        kv = pq.read_metadata(meta).metadata or {}
    except Exception:
        return False
    return _UNISCHEMA_KEY in kv


def open_petastorm(table: str):
    """The snapshot of a Petastorm dataset: its files, Arrow schema and Unischema."""
    import pyarrow.dataset as ds
    from petastorm.etl.dataset_metadata import get_schema_from_dataset_url

    from keras_dl.data.snapshot import TableSnapshot
    from keras_dl.data.tables.storage import file_url

    root = os.path.abspath(table.removeprefix("file://"))
    try:
        unischema = get_schema_from_dataset_url(file_url(root))
    except Exception as exc:
        raise DataError(f"Petastorm dataset {table!r} has no readable Unischema: {exc}") from None
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    files = tuple(sorted(dataset.files))
    if not files:
        raise DataError(f"Petastorm dataset {table!r} holds no Parquet file.")
    return TableSnapshot(
        uri=root,
        format="petastorm",
        version=None,
        files=files,
        partitions=tuple({} for _ in files),
        schema=dataset.schema,
        unischema=unischema,
    )


def plan_spec(snapshot, name: str, accept, role: str):
    """A FeatureSpec for a Unischema field: dtype and shape from the schema, not the bytes."""
    from keras_dl.data.features import BINARY, NUMERIC, STRING, FeatureSpec

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
