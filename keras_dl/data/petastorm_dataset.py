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
from collections.abc import Iterator

import numpy as np

from keras_dl.errors import DataError

CHUNK_ROWS = 256  # rows stacked per chunk handed to tf.data
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

    from keras_dl.data.sources import TableSnapshot
    from keras_dl.data.tables.petastorm_meta import read_unischema

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


def iter_rows_as_chunks(
    snapshot, plan, *, shard, num_shards, epochs, shuffle, seed, workers
) -> Iterator[dict[str, np.ndarray]]:
    """Yield ``{column: array}`` chunks of CHUNK_ROWS decoded rows from ``make_reader``.

    Petastorm 0.13.1 ends finite reads early (see ``keras_dl.data.reader``): an unsharded finite
    read runs the reader infinitely and stops after exactly ``epochs`` times the table's rows.
    A sharded finite read (not used by ``make_splits``) re-opens only when it got nothing.
    """
    if epochs is not None and num_shards <= 1:
        import pyarrow.parquet as pq

        rows = epochs * sum(pq.ParquetFile(f).metadata.num_rows for f in snapshot.files)
        yield from _read_chunks(
            snapshot, plan, shard, num_shards, None, shuffle, seed or 1, workers, limit=rows
        )
        return
    for _ in range(4):
        yielded = False
        for chunk in _read_chunks(
            snapshot, plan, shard, num_shards, epochs, shuffle, seed, workers
        ):
            yielded = True
            yield chunk
        if yielded:
            return


def _read_chunks(snapshot, plan, shard, num_shards, epochs, shuffle, seed, workers, limit=None):
    import warnings

    from petastorm import make_reader

    from keras_dl.data import petastorm_compat
    from keras_dl.data.reader import reader_options
    from keras_dl.data.sources import file_url
    from keras_dl.data.tables.petastorm_meta import known_unischema

    petastorm_compat.install()  # Petastorm's own metadata unpickling is patched too
    # make_reader would unpickle the Unischema again: hand it the one open_petastorm vetted.
    with warnings.catch_warnings(), known_unischema(snapshot.uri, snapshot.unischema):
        warnings.simplefilter("ignore", FutureWarning)
        reader = make_reader(
            file_url(snapshot.uri),
            schema_fields=plan.columns,
            **reader_options(shard, num_shards, epochs, shuffle, seed, workers),
        )
    try:
        rows = []
        for read, row in enumerate(reader, 1):
            rows.append(row)
            if len(rows) == CHUNK_ROWS or read == limit:
                yield _stack(rows, plan)
                rows = []
            if read == limit:
                return
        if rows:
            yield _stack(rows, plan)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"Reading Petastorm dataset {snapshot.uri!r} failed: {exc}") from exc
    finally:
        reader.stop()
        reader.join()


def _stack(rows, plan) -> dict[str, np.ndarray]:
    out = {}
    for name in plan.columns:
        values = [getattr(r, name) for r in rows]
        out[name] = np.stack(values) if np.ndim(values[0]) else np.asarray(values)
    return out
