"""A Delta table at one version -> :class:`~keras_dl.data.tables.snapshot.TableSnapshot`.

The log is replayed by :mod:`.delta_log`; this module reads what the replay found, as the Delta
protocol requires of a reader:

- **Protocol first.** The reader version and reader features are checked before anything is
  read. A feature this reader does not implement is refused by name, with a fix.
- **Schema** from ``metaData.schemaString`` (Spark's JSON types) to Arrow, nested types included.
  ``timestamp`` is UTC, ``timestamp_ntz`` has no zone.
- **Column mapping** (``name`` and ``id`` modes): the physical names (and field ids) inside the
  Parquet files are kept beside the logical schema; partition values are keyed by physical name.
- **Partition values** from the log, typed by the schema as delta-kernel types them.
- **Deletion vectors**: each live file's deleted rows, decoded and checked.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from keras_dl.data.tables.deletion_vectors import read_deletion_vector
from keras_dl.data.tables.delta_log import LOG, replay
from keras_dl.data.tables.partition_values import BadValue, parse_partition_text
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.storage import Storage

# Reader features this reader implements (Delta protocol, "Valid Feature Names").
SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",  # a rule for VACUUM, nothing for a reader to do
        "typeWidening",  # older files hold narrower types: every column is cast to the table's
        "typeWidening-preview",
    }
)
_FIXES = {
    "deletionVectors": "REORG TABLE ... APPLY (PURGE)",
    "variantType": "store the column as a JSON string instead",
    "variantType-preview": "store the column as a JSON string instead",
    "catalogManaged": "read it through its catalog's engine and write a copy",
}
MAX_READER_VERSION = 3
PHYSICAL_NAME = "delta.columnMapping.physicalName"
ROW_ID_COLUMN = "delta.rowTracking.materializedRowIdColumnName"
FIELD_ID = "delta.columnMapping.id"
_PRIMITIVES = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def is_delta(storage: Storage) -> bool:
    """True when the folder has a ``_delta_log`` folder: it is then read as Delta or refused."""
    return storage.is_dir(LOG)


def open_delta(
    storage: Storage, version: int | None = None, timestamp: str | None = None
) -> TableSnapshot:
    """The snapshot of a Delta table at ``version``, ``timestamp`` or its latest version.

    Raises:
        DataError: For a missing version, a log with gaps, a reader feature this reader does
            not support, or a deletion vector that cannot be read.
    """
    state = replay(storage, version, timestamp)
    check_protocol(state.protocol, storage.uri)
    meta = state.metadata
    mode = (meta.get("configuration") or {}).get("delta.columnMapping.mode", "none")
    if mode not in ("none", "name", "id"):
        raise DataError(
            f"Delta table {storage.uri!r} uses column mapping mode {mode!r}, which the Delta "
            "protocol does not define (none, name or id)."
        )
    try:
        fields = json.loads(meta["schemaString"])["fields"]
    except (KeyError, ValueError, TypeError):
        raise DataError(f"Delta table {storage.uri!r} has no readable schema in its log.") from None
    schema = pa.schema([_arrow_field(f, physical=False, table=storage.uri) for f in fields])
    physical = None
    if mode != "none":
        physical = pa.schema([_arrow_field(f, physical=True, table=storage.uri) for f in fields])
    partition_columns = tuple(meta.get("partitionColumns") or ())
    keys = {c: _physical_name(schema, physical, c) for c in partition_columns}
    strings = frozenset(
        _physical_name(schema, physical, f.name)
        for f in schema
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    )
    prefix = _string_prefix(meta)
    files, parts, deleted, records, stats, info = [], [], [], [], [], []
    for add in sorted(state.adds, key=lambda a: unquote(a["path"])):
        path = unquote(add["path"])
        files.append(
            storage.file_uri(storage.strip(path)) if "://" in path else _join(storage, path)
        )
        values = add.get("partitionValues") or {}
        parts.append(
            {
                c: parse_partition_value(values.get(keys[c]), schema.field(c).type, c, storage.uri)
                for c in partition_columns
            }
        )
        dv = add.get("deletionVector")
        deleted.append(read_deletion_vector(dv, storage.uri, storage.read_bytes) if dv else None)
        stats.append(file_stats(add, strings, prefix))
        records.append(_num_records(stats[-1]))
        info.append(file_info(add))
    return TableSnapshot(
        uri=storage.uri,
        format="delta",
        version=state.version,
        files=tuple(files),
        partitions=tuple(parts),
        schema=schema,
        partition_columns=partition_columns,
        deleted_rows=tuple(deleted),
        physical_schema=physical,
        file_records=tuple(records),
        file_stats=tuple(stats),
        table_id=meta.get("id"),
        file_info=tuple(info),
        row_id_column=(meta.get("configuration") or {}).get(ROW_ID_COLUMN),
    )


def file_info(action: dict) -> dict:
    """What an ``add`` (or ``cdc``) action says of its file beside its rows: its path as the log
    names it, its size, its deletion vector's descriptor and its ``baseRowId``."""
    return {
        "path": unquote(action["path"]),
        "size": action.get("size"),
        "deletionVector": action.get("deletionVector") or None,
        "baseRowId": action.get("baseRowId"),
    }


def check_protocol(protocol: dict, table: str) -> None:
    """Refuse a table whose reader version or reader features this reader does not support."""
    reader_version = int(protocol.get("minReaderVersion", 1))
    if reader_version > MAX_READER_VERSION:
        raise DataError(
            f"Delta table {table!r} needs reader version {reader_version}; keras_dl reads up to "
            f"{MAX_READER_VERSION}. Write a copy of it with an older protocol to read it here."
        )
    features = protocol.get("readerFeatures") or []
    unsupported = [f for f in features if f not in SUPPORTED_READER_FEATURES]
    if unsupported:
        fixes = "; ".join(f"{f}: {_FIXES.get(f, 'drop it')}" for f in unsupported)
        raise DataError(
            f"Delta table {table!r} uses the reader feature(s) {', '.join(unsupported)}, which "
            f"keras_dl cannot read yet (it reads {', '.join(sorted(SUPPORTED_READER_FEATURES))}). "
            f"Rewrite the table without them ({fixes}; then ALTER TABLE ... DROP FEATURE), or "
            "read a copy written without them."
        )


def parse_partition_value(value: str | None, kind: pa.DataType, column: str, table: str) -> Any:
    """A partition value from the log, typed as ``kind``; missing is None (null).

    Read as delta-kernel reads it (:mod:`.partition_values`): numbers as text, dates as
    ``YYYY-MM-DD``, timestamps as ``YYYY-MM-DD HH:MM:SS[.ffffff]`` (UTC) or RFC 3339,
    booleans as ``true``/``false``, binary as the UTF-8 bytes of the text; an empty text is
    a null, or the empty value of a string or binary column.
    """
    if value is None:
        return None
    try:
        return parse_partition_text(value, kind)
    except BadValue:
        raise DataError(
            f"Delta table {table!r} has the partition value {value!r} for column {column!r}, "
            f"which is not a {kind} value as the Delta protocol serializes them (delta-kernel "
            "refuses it too). The log is damaged or its writer does not conform."
        ) from None


def delta_type(spec: Any, physical: bool, table: str) -> pa.DataType:
    """Spark's JSON type (as in ``schemaString``) to Arrow, with physical nested names if asked."""
    if isinstance(spec, str):
        if spec in _PRIMITIVES:
            return _PRIMITIVES[spec]
        if spec.startswith("decimal"):
            precision, scale = (int(x) for x in spec[spec.index("(") + 1 : -1].split(","))
            return pa.decimal128(precision, scale)
        raise DataError(
            f"Delta table {table!r} has a column of type {spec!r}, which keras_dl cannot read. "
            "Cast it to a supported type (numbers, strings, dates, timestamps, binary, "
            "decimals, arrays, maps, structs) in a copy of the table."
        )
    kind = spec.get("type")
    if kind == "array":
        return pa.list_(delta_type(spec["elementType"], physical, table))
    if kind == "map":
        return pa.map_(
            delta_type(spec["keyType"], physical, table),
            delta_type(spec["valueType"], physical, table),
        )
    if kind == "struct":
        return pa.struct([_arrow_field(f, physical, table) for f in spec["fields"]])
    raise DataError(f"Delta table {table!r} has a column of unknown type {spec!r}.")


def _arrow_field(spec: dict, physical: bool, table: str) -> pa.Field:
    meta = spec.get("metadata") or {}
    name = meta.get(PHYSICAL_NAME, spec["name"]) if physical else spec["name"]
    field_meta = None
    if physical and meta.get(FIELD_ID) is not None:
        # Parquet field ids, as pyarrow reports them: column mapping's id mode matches on these.
        field_meta = {b"PARQUET:field_id": str(meta[FIELD_ID]).encode()}
    kind = delta_type(spec["type"], physical, table)
    return pa.field(name, kind, nullable=spec.get("nullable", True), metadata=field_meta)


def file_stats(add: dict, strings=(), prefix: int = 32) -> dict | None:
    """The column statistics of an ``add`` action: its ``stats`` (JSON text in a commit, or in
    a checkpoint) or a checkpoint's ``stats_parsed``; None when it has neither.

    Delta writers cut string statistics to their first ``prefix`` characters
    (``delta.dataSkippingStringPrefixLength``, 32 by default): a cut minimum still bounds the
    values from below, a cut maximum does not bound them from above, so the maximum of each
    physical string column in ``strings`` that is that long or longer is left out.
    """
    stats = add.get("stats")
    if isinstance(stats, str):
        try:
            stats = json.loads(stats, parse_float=Decimal)  # decimals exact, not via a double
        except ValueError:
            stats = None
    if not isinstance(stats, dict):
        stats = add.get("stats_parsed")
    if not isinstance(stats, dict):
        return None
    highs = stats.get("maxValues")
    if isinstance(highs, dict) and any(
        isinstance(highs.get(c), str) and len(highs[c]) >= prefix for c in strings
    ):
        highs = {
            c: v
            for c, v in highs.items()
            if not (c in strings and isinstance(v, str) and len(v) >= prefix)
        }
        stats = {**stats, "maxValues": highs}
    return stats


def _num_records(stats: dict | None) -> int | None:
    """``stats.numRecords`` of an ``add`` action, or None."""
    number = stats.get("numRecords") if isinstance(stats, dict) else None
    return int(number) if isinstance(number, int) and number >= 0 else None


def _string_prefix(meta: dict) -> int:
    """The table's ``delta.dataSkippingStringPrefixLength`` (32 by default, as in Delta)."""
    value = (meta.get("configuration") or {}).get("delta.dataSkippingStringPrefixLength", "32")
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0  # unreadable: no string maximum is trusted


def _physical_name(schema: pa.Schema, physical: pa.Schema | None, column: str) -> str:
    if physical is None:
        return column
    return physical.field(schema.get_field_index(column)).name


def _join(storage: Storage, relative: str) -> str:
    return storage.file_uri(storage.path(relative))
