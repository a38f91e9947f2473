"""A Mosaic StreamingDataset (MDS) folder -> :class:`TableSnapshot`.

A folder (local or on an object store) whose root holds an MDS ``index.json`` is read like any
table. Its shards are decoded once (:mod:`.mds_shards`) into a Parquet file each, with page
checksums, in a local folder named by the dataset's content version; the snapshot reads those
files, so shard planning, exact epochs, the shuffle, ``data.cache_dir`` and resume are the
same as for any Parquet table, and later runs (and the other ranks on the host) reuse the
decoded files. Each shard's row count comes from ``index.json``.

The version recorded in lineage is derived from the shards' hashes in ``index.json`` or, when
the shards carry none, from the index file's content hash. Every shard file is checked
against the index (present, the size it records, and its hashes where ``hashlib`` has them).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from keras_dl.data.tables import mds_cache
from keras_dl.data.tables.mds_shards import arrow_fields, decode_shard, decompressor, sample_dtypes
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.storage import Storage

INDEX = "index.json"
_DECODER = "keras_dl-mds-1"  # part of the cache key: a new decoding never reuses old files
_ROWS_PER_GROUP = 1024


def is_mds(storage: Storage) -> bool:
    """True when the folder's root holds an MDS ``index.json``."""
    import pyarrow.fs as pafs

    return storage.fs.get_file_info(storage.path(INDEX)).type == pafs.FileType.File


def open_mds(storage: Storage, cache_root: str | None = None) -> TableSnapshot:
    """The snapshot of the MDS dataset at ``storage``, its shards decoded into ``cache_root``
    (default ``$KERAS_DL_MDS_CACHE`` or ``~/.cache/keras-dl/mds``; :mod:`.mds_cache`) once.

    Raises:
        DataError: Naming the folder, shard or column: an unreadable index, a shard format
            other than MDS, a missing shard or one of another size or hash than the index
            records, an encoding not read (``pkl`` always), a compression not available.
    """
    where = repr(storage.uri)
    raw = _read(storage, INDEX, where)
    try:
        shards = json.loads(raw)["shards"]
        names, encodings = shards[0]["column_names"], shards[0]["column_encodings"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise DataError(
            f"{INDEX} of MDS dataset {where} is not an MDS index ({exc!r}). Restore it or "
            "re-write the dataset."
        ) from None
    for i, shard in enumerate(shards):
        _check_shard(shard, i, names, encodings, where)
    arrow_fields(names, encodings, where)  # refuses pkl and unknown encodings before any read
    infos = _check_files(storage, shards, where)
    version = content_version(shards, raw)
    key = version
    if version.startswith("index-"):  # no hashes: a shard rewritten in place is decoded again
        stamps = json.dumps([(i.size, i.mtime_ns) for i in infos]).encode()
        key = f"{version}-{hashlib.sha256(stamps).hexdigest()[:12]}"
    folder = mds_cache.use(cache_root or mds_cache.cache_root(), key)
    dtypes: dict | None = None if "ndarray" in encodings else {}  # read from the first sample
    files = []
    for i, shard in enumerate(shards):
        target = os.path.join(folder, f"{i:06d}.parquet")
        if not os.path.exists(target) or dtypes is None:
            data = _shard_bytes(storage, shard, where)
            names_of = (shard["column_names"], shard["column_encodings"], shard["column_sizes"])
            label = f"Shard {_name(shard)!r} of MDS dataset {where}"
            if dtypes is None and shard["samples"]:
                dtypes = sample_dtypes(data, *names_of, label)
            if not os.path.exists(target):
                _write(decode_shard(data, *names_of, label, dtypes), target)
        files.append(target)
    schema = pa.schema(arrow_fields(names, encodings, where, dtypes))
    return TableSnapshot(
        uri=storage.uri,
        format="mds",
        version=None,
        files=tuple(files),
        partitions=tuple({} for _ in files),
        schema=schema,
        file_records=tuple(int(s["samples"]) for s in shards),
        content_version=version,
    )


def content_version(shards: list[dict], index: bytes) -> str:
    """The dataset's version: a hash of its shards' names and hashes, or of ``index.json``'s
    bytes when a shard has no hash."""
    parts = []
    for shard in shards:
        data = shard.get("zip_data") or shard["raw_data"]
        if not data.get("hashes"):
            return "index-sha256-" + hashlib.sha256(index).hexdigest()[:32]
        parts.append([data["basename"], sorted(data["hashes"].items())])
    text = json.dumps([_DECODER, parts], sort_keys=True).encode()
    return "shards-sha256-" + hashlib.sha256(text).hexdigest()[:32]


def _check_shard(shard: dict, i: int, names, encodings, where: str) -> None:
    try:
        fmt, name = shard.get("format"), _name(shard)
        same = shard["column_names"] == names and shard["column_encodings"] == encodings
        int(shard["samples"])
        shard["column_sizes"]  # noqa: B018 - present
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(
            f"Shard {i} in {INDEX} of MDS dataset {where} lacks {exc}. Restore the index or "
            "re-write the dataset."
        ) from None
    if shard.get("version", 2) != 2:
        raise DataError(
            f"Shard {name!r} of MDS dataset {where} is in MDS version {shard['version']!r}; "
            "keras_dl reads version 2 (mosaicml-streaming 0.4 and later). Re-write the "
            "dataset with a current MDSWriter."
        )
    if fmt != "mds":
        raise DataError(
            f"Shard {name!r} of dataset {where} is in format {fmt!r}; keras_dl reads MDS "
            "shards only. Convert the dataset to MDS (MDSWriter) or to Delta."
        )
    if not same:
        raise DataError(
            f"Shard {name!r} of MDS dataset {where} has other columns or encodings than the "
            "first shard: one table has one schema. Re-write the dataset with one."
        )
    decompressor(shard.get("compression"), f"Shard {name!r} of MDS dataset {where}")


def _check_files(storage: Storage, shards: list[dict], where: str) -> list:
    """Every shard file is there with the size the index records (decoded copies or not);
    their ``FileInfo``s."""
    import pyarrow.fs as pafs

    entries = [
        (s.get("zip_data") if s.get("compression") else None) or s["raw_data"] for s in shards
    ]
    infos = storage.fs.get_file_info([storage.path(e["basename"]) for e in entries])
    for entry, info in zip(entries, infos):
        label = f"Shard file {entry['basename']!r} of MDS dataset {where}"
        if info.type != pafs.FileType.File:
            raise DataError(
                f"{label} is missing. Restore it, or point data.table at a complete MDS folder."
            )
        if info.size != entry["bytes"]:
            raise DataError(
                f"{label} holds {info.size} bytes where {INDEX} records {entry['bytes']}: it "
                "was cut or changed after the dataset was written. Restore it or re-write the "
                "dataset."
            )
    return infos


def _shard_bytes(storage: Storage, shard: dict, where: str) -> bytes:
    """The shard's raw bytes, checked against the index's size and hashes."""
    compressed = shard.get("zip_data") if shard.get("compression") else None
    entry = compressed or shard["raw_data"]
    label = f"Shard {entry['basename']!r} of MDS dataset {where}"
    data = _read(storage, entry["basename"], where, shard=True)
    _check_bytes(data, entry, label)
    if compressed is None:
        return data
    try:
        raw = decompressor(shard["compression"], label)(data, shard["raw_data"]["bytes"])
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{label} does not decompress ({exc}). Restore the file.") from None
    _check_bytes(raw, shard["raw_data"], label + " (decompressed)")
    return raw


def _check_bytes(data: bytes, entry: dict, label: str) -> None:
    if len(data) != entry["bytes"]:
        raise DataError(
            f"{label} holds {len(data)} bytes where {INDEX} records {entry['bytes']}: it was "
            "cut or changed after the dataset was written. Restore it or re-write the dataset."
        )
    for algo, want in (entry.get("hashes") or {}).items():
        if algo in hashlib.algorithms_available and hashlib.new(algo, data).hexdigest() != want:
            raise DataError(
                f"{label} does not match its {algo} hash in {INDEX}: the file changed after "
                "the dataset was written. Restore it or re-write the dataset."
            )


def _read(storage: Storage, name: str, where: str, shard: bool = False) -> bytes:
    try:
        with storage.fs.open_input_stream(storage.path(name), compression=None) as f:
            return f.read()
    except (FileNotFoundError, OSError) as exc:
        what = f"Shard file {name!r}" if shard else f"{name}"
        raise DataError(
            f"{what} of MDS dataset {where} cannot be read ({exc}). Restore it, or point "
            "data.table at a complete MDS folder."
        ) from None


def _write(table: pa.Table, target: str) -> None:
    tmp = f"{target}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, tmp, row_group_size=_ROWS_PER_GROUP, write_page_checksum=True)
    os.replace(tmp, target)  # atomic: ranks decoding the same shard never see half a file


def _name(shard: dict) -> str:
    return (shard.get("zip_data") or shard.get("raw_data") or {}).get("basename", "?")
