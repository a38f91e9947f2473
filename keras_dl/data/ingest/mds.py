"""Write a Mosaic StreamingDataset (MDS) folder into a Delta table.

Each MDS column becomes a Delta column as the MDS reader decodes it
(:mod:`keras_dl.data.tables.mds_shards`): scalars, text, bytes, JSON text, encoded JPEG/PNG
bytes, ndarrays as flattened lists (a ``<name>__shape`` column when each sample stores its
shape). Delta has no unsigned or 16-bit float types, so uint8/16/32 are widened to the next
signed integer, uint64 is stored as int64 when every value fits (else refused, naming the
column), and float16 as float32: every value is kept exactly. Rows keep the dataset's order.
``pkl`` columns are refused, never unpickled.

Example::

    keras-dl ingest mds /dbfs/mds/train --to data/train
"""

from __future__ import annotations

import argparse
import tempfile

import pyarrow as pa
import pyarrow.compute as pc

from keras_dl.errors import DataError

ROWS_PER_GROUP = 1024
_WIDER = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.int64(),
    pa.float16(): pa.float32(),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl ingest mds`` arguments (``--to``/``--mode``/``--rows-per-group`` come
    from the CLI)."""
    p.add_argument("folder", help="MDS folder (local or URI) with an index.json at its root")


def run(args) -> int:
    """Ingest and print the report."""
    print(ingest_mds(args.folder, args.to, mode=args.mode, rows_per_group=args.rows_per_group))
    return 0


def ingest_mds(folder: str, to: str, mode: str = "error", rows_per_group: int = ROWS_PER_GROUP):
    """Write the rows of the MDS dataset at ``folder`` into the Delta table ``to``.

    Raises:
        DataError: When ``folder`` is not a readable MDS dataset (see
            :func:`keras_dl.data.tables.mds.open_mds`), or a uint64 value does not fit int64.
    """
    import pyarrow.parquet as pq

    from keras_dl.data.ingest.datasets import write_table
    from keras_dl.data.tables.mds import is_mds, open_mds
    from keras_dl.storage import open_storage

    storage = open_storage(folder)
    if not is_mds(storage):
        raise DataError(
            f"{folder!r} is not an MDS dataset (no index.json at its root). Point the command "
            "at the folder MDSWriter wrote (its `out`)."
        )
    with tempfile.TemporaryDirectory(prefix="keras_dl-mds-") as decoded:
        snapshot = open_mds(storage, cache_root=decoded)
        schema = pa.schema([_delta_field(f) for f in snapshot.schema])

        def batches():
            for path in snapshot.files:
                for batch in pq.ParquetFile(path).iter_batches(batch_size=rows_per_group):
                    yield _widened(batch, schema, folder)

        reader = pa.RecordBatchReader.from_batches(schema, batches())
        return write_table(reader, to, mode=mode, rows_per_group=rows_per_group)


def _delta_field(field: pa.Field) -> pa.Field:
    kind = field.type
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind):
        return field.with_type(pa.list_(_WIDER.get(kind.value_type, kind.value_type)))
    return field.with_type(_WIDER.get(kind, kind))


def _widened(batch: pa.RecordBatch, schema: pa.Schema, folder: str) -> pa.RecordBatch:
    arrays = []
    for column, field in zip(batch.columns, schema):
        values = column.flatten() if pa.types.is_fixed_size_list(column.type) else column
        if pa.types.is_list(values.type):
            values = values.values
        if values.type == pa.uint64() and len(values) and pc.max(values).as_py() >= 1 << 63:
            raise DataError(
                f"Column {field.name!r} of MDS dataset {folder!r} holds uint64 values above "
                "int64's maximum, which Delta (signed integers only) cannot store. Re-write "
                "that column as str_int or bytes, or drop it before converting."
            )
        arrays.append(column.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
