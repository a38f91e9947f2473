"""Write an ingest's Parquet files with page checksums, and the Delta add actions that commit them.

delta-rs (deltalake's ``write_deltalake``) cannot write Parquet page checksums, so ingest writes
its files with pyarrow's dataset writer (``write_page_checksum=True``, row groups of exactly
``rows_per_group`` rows, hive partition folders) and commits them once through
:func:`keras_dl.data.ingest.spark_delta.commit`. Types are cast as delta-rs cast them, so the schema the
table records is the one ``write_deltalake`` recorded; partition values are Delta's texts.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator, Sequence
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from keras_dl.errors import DataError

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Delta's (and Hive's) folder for a null value
TARGET_FILE_BYTES = 128 << 20  # of Arrow memory per file, about delta-rs' 100 MB target


def delta_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type delta-rs writes for ``t``: unsigned as signed, timestamps in microseconds."""
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[t.bit_width]
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", t.tz)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_dictionary(t):
        value = delta_type(t.value_type)
        if pa.types.is_string(value) or pa.types.is_large_string(value):
            return pa.dictionary(t.index_type, value)
        return value
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(delta_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(delta_type(t.key_type)),
            t.item_field.with_type(delta_type(t.item_type)),
        )
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(delta_type(t.value_type)), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(delta_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(delta_type(t.value_type)))
    return t


def write_files(
    batches: pa.RecordBatchReader,
    to: str,
    partition_by: Sequence[str],
    rows_per_group: int,
    table: pa.Schema | None = None,
) -> tuple[pa.Schema, list]:
    """Write ``batches`` as Parquet files under ``to``; the table's schema and an add per file.

    Nothing is committed: the files stay invisible to readers until the caller commits them.
    ``table``: the schema of the table the files join (append or overwrite), which they must
    match column for column; a column of another type is cast to the table's, as delta-rs did.
    """
    from deltalake import Schema
    from deltalake.transaction import AddAction

    from keras_dl.data.ingest.spark_delta import file_stats
    from keras_dl.storage import filesystem, local_path

    schema = pa.schema([f.with_type(delta_type(f.type)) for f in batches.schema])
    Schema.from_arrow(schema)  # a type Delta cannot hold fails here, before any file is written
    if table is not None:
        schema = _conform(schema, table, to)
    for name in partition_by:
        if name not in schema.names:
            raise DataError(f"Partition column {name!r} is not a column of {schema.names}.")
    file_schema = pa.schema(
        [f.with_type(pa.string()) if f.name in partition_by else f for f in schema]
    )
    first, rest = _peek(batches)
    row_bytes = first.nbytes / first.num_rows if first is not None else 1.0
    groups_per_file = max(1, int(TARGET_FILE_BYTES / max(row_bytes * rows_per_group, 1.0)))
    fs, root = filesystem(to)
    if local_path(to) is not None:
        fs.create_dir(root, recursive=True)
    written = []

    import pyarrow.dataset as ds

    ds.write_dataset(
        pa.RecordBatchReader.from_batches(
            file_schema, _delta_batches(first, rest, schema, file_schema, partition_by)
        ),
        root,
        filesystem=fs,
        format="parquet",
        file_options=ds.ParquetFileFormat().make_write_options(
            write_page_checksum=True,
            use_compliant_nested_type=False,  # "item", as delta-rs
        ),
        partitioning=ds.HivePartitioning(
            pa.schema([(name, pa.string()) for name in partition_by]),
            null_fallback=NULL_PARTITION,
        )
        if partition_by
        else None,
        basename_template=f"part-{{i}}-{uuid.uuid4()}-c000.parquet",
        max_rows_per_group=rows_per_group,
        min_rows_per_group=rows_per_group,
        max_rows_per_file=rows_per_group * groups_per_file,
        preserve_order=True,
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=written.append,
    )
    now = int(time.time() * 1000)
    actions = []
    for file in written:
        relative = file.path[len(root) :].lstrip("/")
        actions.append(
            AddAction(
                relative,  # as on storage: deltalake percent-encodes it in the log
                int(file.size),
                _partition_values(relative, partition_by),
                now,
                True,
                file_stats(file.metadata),
            )
        )
    return (schema if table is None else table), actions


def _conform(schema: pa.Schema, table: pa.Schema, to: str) -> pa.Schema:
    """``schema`` with the types of ``table`` where Delta's types differ; refused unless the
    columns are the same (in any order)."""
    from deltalake import Schema

    if sorted(schema.names) != sorted(table.names):
        raise DataError(
            f"The rows' columns {schema.names} are not the columns of the Delta table {to!r} "
            f"({table.names}). Write the same columns, or write a new table."
        )
    ours = {f.name: f.type for f in Schema.from_arrow(schema).fields}
    theirs = {f.name: f.type for f in Schema.from_arrow(table).fields}
    return pa.schema([f if ours[f.name] == theirs[f.name] else table.field(f.name) for f in schema])


def _peek(batches: pa.RecordBatchReader) -> tuple[pa.RecordBatch | None, Iterator]:
    """The first batch that has rows (None if none does), and the reader past it."""
    for batch in batches:
        if batch.num_rows:
            return batch, batches
    return None, iter(())


def _delta_batches(
    first, rest, schema: pa.Schema, file_schema: pa.Schema, partition_by
) -> Iterator[pa.RecordBatch]:
    """Each batch cast to the table's types, its partition columns as Delta's texts."""
    if first is None:
        return
    for batch in itertools.chain([first], rest):
        columns = []
        for field in schema:
            column = _cast(field.name, batch.column(field.name), field.type)
            if field.name in partition_by:
                column = _folder_names(partition_texts(field.name, column))
            columns.append(column)
        yield pa.RecordBatch.from_arrays(columns, schema=file_schema)


def _cast(name: str, column: pa.Array, to: pa.DataType) -> pa.Array:
    if column.type == to:
        return column
    try:
        return pc.cast(column, options=pc.CastOptions(to, allow_time_truncate=True))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(
            f"Column {name!r} ({column.type}) cannot be stored as {to} ({exc}): Delta has no "
            "unsigned integers, and a table keeps its types. Cast the column before ingest."
        ) from None


def _folder_names(texts: pa.Array) -> pa.Array:
    """Partition texts percent-encoded, nulls kept.

    pyarrow escapes folder names itself, but not control characters (a NUL ends the name, so two
    values could share a folder): it gets these names, all ``%XX`` and unreserved characters,
    and escapes their ``%`` once more (``_partition_values`` decodes both).
    """
    encoded = texts.dictionary_encode()
    names = pa.array([quote(v, safe="") for v in encoded.dictionary.to_pylist()], pa.string())
    return names.take(encoded.indices)


def partition_texts(name: str, column: pa.Array) -> pa.Array:
    """A partition column's values as the Delta protocol serializes them (nulls stay null)."""
    t = column.type
    if pa.types.is_dictionary(t):
        return partition_texts(name, column.dictionary_decode())
    if pa.types.is_timestamp(t):  # "2024-01-01 10:00:00.500000", in UTC when zoned
        column = column.cast(pa.timestamp("us", "UTC" if t.tz else None))
        return pc.strftime(column, "%Y-%m-%d %H:%M:%S")
    if pa.types.is_unsigned_integer(t) or pa.types.is_date64(t):
        column = column.cast(delta_type(t))
    try:
        return pc.cast(column, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(
            f"Partition column {name!r} ({t}) has values Delta cannot write as partition texts "
            f"({exc}): binary ones must be UTF-8. Partition by another column."
        ) from None


def _partition_values(relative: str, partition_by: Sequence[str]) -> dict[str, str | None]:
    """``{column: Delta text or None}`` from a file's hive folders ``col=value/``."""
    values = {}
    for segment in relative.split("/")[:-1]:
        name, _, value = segment.partition("=")
        values[unquote(name)] = None if value == NULL_PARTITION else unquote(unquote(value))
    return {name: values[name] for name in partition_by}
