"""Existing Petastorm datasets (a Unischema with codecs, written by ``materialize_dataset``) as
snapshots.

Users who already have Petastorm data read it as it is: the dataset's Unischema gives each
column's dtype and shape, and Petastorm's row reader (``make_reader``) decodes the codecs
(images, ndarrays). Rows are then stacked into dense chunks, so the rest of the data path
(batching, preprocess, prefetch) is the same as for Delta and Parquet. ``make_reader`` is
row-based, so this path is slower than a plain table: for speed, re-ingest the images as
encoded bytes and decode them in tf.data (``keras_dl.data.tables.images``).
"""

from __future__ import annotations

import os

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


def open_petastorm(table: str, *, trust: bool | None = None):
    """The snapshot of a Petastorm dataset: its files, Arrow schema and Unischema.

    Args:
        table: The dataset's local folder or ``file://`` URL.
        trust: Unpickle the Unischema with Petastorm's own loader, which runs any code the
            pickle names (``data.trust_petastorm_metadata``). Defaults to None: the
            ``petastorm_meta.trusting()`` scope, off unless entered; then only data classes load.

    Raises:
        DataError: When the Unischema is missing, or its pickle names anything but data.
    """
    import pyarrow.dataset as ds

    from keras_dl.data.tables.petastorm_meta import read_unischema
    from keras_dl.data.tables.snapshot import TableSnapshot

    root = os.path.abspath(table.removeprefix("file://"))
    unischema = read_unischema(root, trust=trust)
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
