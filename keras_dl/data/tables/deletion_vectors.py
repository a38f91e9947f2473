"""Delta deletion vectors: the rows of a data file that a DELETE, UPDATE or MERGE removed.

A deletion vector (Delta protocol, "Deletion Vectors" and appendix "Deletion Vector Format") is
a set of row indexes within one Parquet file, serialized as a 64-bit portable roaring bitmap
behind a magic number. Its descriptor in an ``add`` action says where it is:

- ``storageType="u"``: in ``<table>/<prefix>/deletion_vector_<uuid>.bin``, where
  ``pathOrInlineDv`` is the random prefix followed by the UUID in 20 Z85 characters;
- ``storageType="p"``: in the file at the absolute path ``pathOrInlineDv``;
- ``storageType="i"``: inline, ``pathOrInlineDv`` being the Z85-encoded bitmap itself.

A DV file holds a version byte, then for each DV (at its ``offset``): its size (4 bytes, big
endian), the bitmap, and a CRC-32 of the bitmap. The checksum and the cardinality are checked, so
a damaged file is an error, never a wrong set of rows.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Callable

import numpy as np

from keras_dl.errors import DataError

MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


def read_deletion_vector(
    descriptor: dict, table: str, read_bytes: Callable[[str, int, int], bytes]
) -> np.ndarray:
    """The sorted row indexes a deletion vector marks as deleted.

    Args:
        descriptor: The ``deletionVector`` of an ``add`` action.
        table: The table's root (path or URI), for relative DV files and messages.
        read_bytes: ``read_bytes(path, offset, length)`` reads a byte range of a file.

    Raises:
        DataError: For an unknown storage type, a missing or damaged DV file, or a bitmap
            whose size, checksum or cardinality does not match its descriptor.
    """
    kind = descriptor.get("storageType")
    where = descriptor.get("pathOrInlineDv") or ""
    size = int(descriptor.get("sizeInBytes") or 0)
    if kind == "i":
        data = z85_decode(where)[:size]
        source = "an inline deletion vector"
    elif kind in ("u", "p"):
        path = dv_path(descriptor, table)
        offset = int(descriptor.get("offset") or 1)  # the first DV follows the version byte
        source = f"deletion vector file {path!r}"
        try:
            raw = read_bytes(path, offset, size + 8)
        except Exception as exc:
            raise DataError(
                f"Delta table {table!r} needs {source}, which cannot be read ({exc}). Restore "
                "the file, or read a version from before the delete."
            ) from None
        data = _unwrap(raw, size, source, table)
    else:
        raise DataError(
            f"Delta table {table!r} has a deletion vector of storage type {kind!r}, which the "
            "Delta protocol does not define (u, p or i). The log may be damaged."
        )
    rows = _decode_bitmap(data, source, table)
    cardinality = descriptor.get("cardinality")
    if cardinality is not None and len(rows) != int(cardinality):
        raise DataError(
            f"In Delta table {table!r}, {source} holds {len(rows)} row(s) but its descriptor "
            f"says {cardinality}. The file does not match the log: restore it."
        )
    return rows


def dv_path(descriptor: dict, table: str) -> str:
    """The file a "u" (relative) or "p" (absolute) deletion vector is stored in."""
    where = descriptor["pathOrInlineDv"]
    if descriptor["storageType"] == "p":
        return where
    prefix, encoded = where[:-20], where[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return "/".join(p for p in (table.rstrip("/"), prefix, name) if p)


def z85_decode(text: str) -> bytes:
    """Decode ZeroMQ's Z85 (base-85) text, as Delta encodes UUIDs and inline bitmaps."""
    if len(text) % 5:
        raise DataError(f"Z85 text of length {len(text)} is not a multiple of 5: {text[:40]!r}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            value = value * 85 + _Z85_INDEX[c]
        out += value.to_bytes(4, "big")
    return bytes(out)


def _unwrap(raw: bytes, size: int, source: str, table: str) -> bytes:
    """Check the size and CRC-32 that frame a DV in its file, and return the bitmap."""
    if len(raw) < size + 8:
        raise DataError(f"Delta table {table!r}: {source} is truncated. Restore the file.")
    (stored_size,) = struct.unpack(">i", raw[:4])
    data = raw[4 : 4 + size]
    (checksum,) = struct.unpack(">I", raw[4 + size : 8 + size])
    if stored_size != size or zlib.crc32(data) != checksum:
        raise DataError(
            f"Delta table {table!r}: {source} fails its size or CRC-32 check (the file is "
            "damaged or not the one the log names). Restore it from a backup."
        )
    return data


def _decode_bitmap(data: bytes, source: str, table: str) -> np.ndarray:
    from pyroaring import BitMap64

    if len(data) < 4 or struct.unpack("<i", data[:4])[0] != MAGIC:
        raise DataError(
            f"Delta table {table!r}: {source} does not start with the deletion-vector magic "
            f"number {MAGIC}. The file is damaged or in a format this reader does not know."
        )
    try:
        bitmap = BitMap64.deserialize(data[4:])
    except Exception as exc:
        raise DataError(f"Delta table {table!r}: {source} is not a valid bitmap ({exc}).") from None
    return np.fromiter(bitmap, dtype=np.int64, count=len(bitmap))
