"""Write Delta tables with deletion vectors and column mapping, as the Delta protocol specifies.

deltalake 0.18 (the pin before pyarrow 18) wrote neither; writing them here keeps the tests
independent of which writer features delta-rs has, following the protocol's "Deletion Vector Format" and "Column Mapping" sections: Parquet files
with physical column names and field ids, ``deletion_vector_<uuid>.bin`` files (or inline
bitmaps), and a commit whose ``add`` actions point at them. The real tables written by Spark and
Databricks in ``fixtures/delta`` check the same reader against other engines.
"""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            value, r = divmod(value, 85)
            chunk.append(_Z85[r])
        out.extend(reversed(chunk))
    return "".join(out)


def bitmap_bytes(rows) -> bytes:
    """Magic number + 64-bit portable roaring bitmap of ``rows``."""
    from pyroaring import BitMap64

    return struct.pack("<i", MAGIC) + BitMap64(sorted(int(r) for r in rows)).serialize()


def write_delta(
    path: str | Path,
    files: list[list[pa.Table]],
    deleted: list[list[int]] | None = None,
    mapping: bool = False,
    inline: bool = False,
    partition: tuple[str, list] | None = None,
    stats: bool = True,
    parquet_options: dict | None = None,
    column_stats: bool = False,
    string_prefix: int = 32,
) -> None:
    """Write version 0 of a table: ``files[i]`` is the row groups of file ``i``.

    Args:
        path: The table's folder.
        files: Per file, its row groups as tables of one schema.
        deleted: Per file, the row indexes (within the file) a deletion vector removes.
        mapping: Column mapping in name mode: physical names ``col-<uuid>`` and field ids.
        inline: Store deletion vectors inline in the log instead of in a DV file.
        partition: ``(column, values per file)``: a string partition column.
        stats: Write each file's ``stats.numRecords`` (readers then plan without footers).
        parquet_options: More ``pq.ParquetWriter`` options (``write_page_checksum``,
            ``compression``...). Defaults to None: pyarrow's defaults.
        column_stats: Also write ``minValues``, ``maxValues`` and ``nullCount`` (keyed by
            physical name) as Spark does: NaN left out, timestamps cut to milliseconds, and
            strings cut to ``string_prefix`` characters (the maximum too, without Delta's
            tie-breaker: the worst case a reader must survive).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    schema = files[0][0].schema
    physical = {n: (f"col-{uuid.uuid4()}" if mapping else n) for n in schema.names}
    fields = [_field(f, physical[f.name], i + 1, mapping) for i, f in enumerate(schema)]
    if partition:
        name = partition[0]
        physical[name] = f"col-{uuid.uuid4()}" if mapping else name
        fields.append(_field(pa.field(name, pa.string()), physical[name], len(fields) + 1, mapping))
    features = ["deletionVectors"] + (["columnMapping"] if mapping else [])
    actions = [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": features,
                "writerFeatures": features,
            }
        },
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps({"type": "struct", "fields": fields}),
                "partitionColumns": [partition[0]] if partition else [],
                "configuration": {
                    "delta.enableDeletionVectors": "true",
                    "delta.columnMapping.mode": "name" if mapping else "none",
                },
                "createdTime": 0,
            }
        },
    ]
    dv_file = root / f"deletion_vector_{uuid.uuid4()}.bin"
    dv_chunks = [b"\x01"]
    for i, groups in enumerate(files):
        name = f"part-{i:05d}-{uuid.uuid4()}.parquet"
        if partition:
            value = partition[1][i]
            name = (
                f"{physical[partition[0]][:4]}{i}/{name}"
                if mapping
                else f"{partition[0]}={value}/{name}"
            )
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        file_schema = _physical_schema(schema, physical, mapping)
        with pq.ParquetWriter(target, file_schema, **(parquet_options or {})) as writer:
            for group in groups:
                writer.write_table(group.rename_columns([physical[n] for n in schema.names]))
        rows = sum(g.num_rows for g in groups)
        add = {
            "path": quote(name, safe="/"),
            "partitionValues": {},
            "size": target.stat().st_size,
            "modificationTime": 0,
            "dataChange": True,
        }
        if stats:
            add["stats"] = json.dumps({"numRecords": rows})
        if column_stats:
            whole = pa.concat_tables(groups)
            add["stats"] = json.dumps(
                {"numRecords": rows, **_column_stats(whole, physical, string_prefix)}
            )
        if partition:
            add["partitionValues"] = {physical[partition[0]]: partition[1][i]}
        rows_deleted = (deleted or [[]] * len(files))[i]
        if rows_deleted:
            data = bitmap_bytes(rows_deleted)
            if inline:
                dv = {"storageType": "i", "pathOrInlineDv": z85_encode(data)}
            else:
                encoded = z85_encode(uuid.UUID(dv_file.name[16:-4]).bytes)
                dv = {
                    "storageType": "u",
                    "pathOrInlineDv": encoded,
                    "offset": sum(len(c) for c in dv_chunks),
                }
                dv_chunks.append(
                    struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
                )
            add["deletionVector"] = {
                **dv,
                "sizeInBytes": len(data),
                "cardinality": len(set(rows_deleted)),
            }
        actions.append({"add": add})
    if len(dv_chunks) > 1:
        dv_file.write_bytes(b"".join(dv_chunks))
    log = root / "_delta_log"
    log.mkdir(exist_ok=True)
    (log / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _column_stats(table: pa.Table, physical: dict, prefix: int) -> dict:
    lows, highs, nulls = {}, {}, {}
    for name in table.column_names:
        column = table.column(name)
        key = physical[name]
        nulls[key] = column.null_count
        values = [v for v in column.to_pylist() if v is not None and v == v]  # no null, no NaN
        if not values:
            continue
        low, high = min(values), max(values)
        if isinstance(low, str):
            low, high = low[:prefix], high[:prefix]
        elif column.type == pa.float32():  # Spark writes a float32 as its shortest decimal
            low, high = (float(str(np.float32(v))) for v in (low, high))
        elif hasattr(low, "isoformat") and hasattr(low, "hour"):
            low, high = (
                v.isoformat(timespec="milliseconds").replace("+00:00", "Z") for v in (low, high)
            )
        lows[key], highs[key] = low, high
    return {"minValues": lows, "maxValues": highs, "nullCount": nulls}


def _field(f: pa.Field, physical: str, field_id: int, mapping: bool) -> dict:
    kinds = {
        "int64": "long",
        "int32": "integer",
        "double": "double",
        "float": "float",
        "string": "string",
        "bool": "boolean",
        "timestamp[us, tz=UTC]": "timestamp",
        "timestamp[us]": "timestamp_ntz",
    }
    meta = {}
    if mapping:
        meta = {"delta.columnMapping.id": field_id, "delta.columnMapping.physicalName": physical}
    return {"name": f.name, "type": kinds[str(f.type)], "nullable": True, "metadata": meta}


def _physical_schema(schema: pa.Schema, physical: dict, mapping: bool) -> pa.Schema:
    out = []
    for i, f in enumerate(schema):
        meta = {b"PARQUET:field_id": str(i + 1).encode()} if mapping else None
        out.append(pa.field(physical[f.name], f.type, metadata=meta))
    return pa.schema(out)


def write_partition_values(path: str | Path, kind: str, values: list, features=()) -> None:
    """Version 0 of a table partitioned by ``p`` of Delta type ``kind``: file ``i`` holds one row
    ``id = i`` and the partition value ``values[i]`` exactly as given (a string, "" or None)."""
    root = Path(path)
    (root / "_delta_log").mkdir(parents=True, exist_ok=True)
    fields = [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "p", "type": kind, "nullable": True, "metadata": {}},
    ]
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    if features:
        protocol = {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": list(features),
            "writerFeatures": list(features),
        }
    actions = [
        {"protocol": protocol},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps({"type": "struct", "fields": fields}),
                "partitionColumns": ["p"],
                "configuration": {},
                "createdTime": 0,
            }
        },
    ]
    for i, value in enumerate(values):
        name = f"part-{i:05d}.parquet"  # the folder is irrelevant: values come from the log
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), root / name)
        add = {
            "path": name,
            "partitionValues": {"p": value},
            "size": (root / name).stat().st_size,
            "modificationTime": 0,
            "dataChange": True,
        }
        actions.append({"add": add})
    text = "\n".join(json.dumps(a, ensure_ascii=False) for a in actions) + "\n"  # raw UTF-8
    (root / "_delta_log" / f"{0:020d}.json").write_text(text, encoding="utf-8")
