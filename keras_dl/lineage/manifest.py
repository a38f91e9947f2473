"""A run's training manifest: per split, the table it read and exactly which rows (no I/O here).

A :class:`SplitManifest` names a split's rows the way the table does, so they can be found again
after the table changed: the table's identity (its URI, its Delta ``metaData.id``, the version or
the ``since_version`` range read), the filters and the split selector, and per file the log's
path, size and deletion-vector descriptor with the *physical* positions of the rows trained, as
sorted runs ``[lo, hi)``: the file's rows less those its deletion vector (or a change snapshot's
mask) removed and those the filters dropped. A file read whole costs one run. Where the table has
row tracking, a row's id is the file's ``baseRowId`` plus its position (Delta protocol, "Row
IDs": default generated row ids).

:func:`fingerprint` names those rows: two splits that read the same rows of the same table
version through the same filters and selector get the same SHA-256; anything else differs,
including a table dropped and written again at the same path (its ``metaData.id`` changes).

Stored form: one JSON header for the run (:func:`to_header`) and per split a Parquet file of its
files (:func:`files_table`: one row a file, the runs as a flat ``list<int64>``), zstd-compressed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from keras_dl.data.stream.row_ranges import to_ids

FORMAT = "keras_dl.training_manifest/1"
Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class FileRows:
    """One file of a split and the rows of it the split trained.

    Attributes:
        path: The file as the Delta log names it (relative to the table), or its URI.
        size: Its size in bytes as the log says (None where no log says).
        deletion_vector: Its deletion vector's descriptor as the log has it, or None.
        base_row_id: Row tracking's ``baseRowId`` (None without row tracking).
        ranges: The physical row positions trained, sorted disjoint runs ``(lo, hi)``.
    """

    path: str
    size: int | None
    deletion_vector: dict | None
    base_row_id: int | None
    ranges: Ranges

    @property
    def rows(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def positions(self) -> np.ndarray:
        """Every trained row's position in the file, ascending."""
        return to_ids(np.asarray(self.ranges, dtype=np.int64).reshape(-1, 2))


@dataclass(frozen=True)
class SplitManifest:
    """The rows one split of a run read, named by the table's identity and its files.

    Attributes:
        split: "train", "validation" or "test".
        table: The table's URI.
        table_id: Delta ``metaData.id`` (None for other formats).
        format: The table's format ("delta", "parquet", ...).
        version: The version read (the range's end for a change snapshot), or None.
        since_version: The range's start for ``data.since_version`` (exclusive), or None.
        filters: ``data.filters`` parsed: ``(column, op, value as text)``.
        selector: ``(split column, value)`` choosing the split's rows, or None.
        files: The files read, in snapshot order, with their trained rows.
        lineage_columns: The columns whose values for these rows are kept beside the manifest
            (``data.lineage_columns``), in the order of :meth:`FileRows.positions` per file.
    """

    split: str
    table: str
    table_id: str | None
    format: str
    version: int | None
    since_version: int | None
    filters: tuple[tuple[str, str, str], ...]
    selector: tuple[str, str] | None
    files: tuple[FileRows, ...] = field(repr=False)
    lineage_columns: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def row_tracking(self) -> bool:
        """Every file has a ``baseRowId``: the rows have Delta row ids."""
        return bool(self.files) and all(f.base_row_id is not None for f in self.files)

    def row_ids(self) -> np.ndarray:
        """The trained rows' Delta row ids (``baseRowId`` + position), ascending per file.

        Raises:
            ValueError: When the table has no row tracking (callers say so).
        """
        if not self.row_tracking:
            raise ValueError(f"table {self.table!r} has no row tracking (no baseRowId)")
        parts = [f.base_row_id + f.positions() for f in self.files]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def fingerprint(m: SplitManifest) -> str:
    """SHA-256 (hex) over the table id, version range, filters, selector and each file's path,
    size, deletion-vector descriptor and trained runs: equal exactly for the same rows read the
    same way. Without a table id (not Delta) the table's URI stands in for it."""
    h = hashlib.sha256()
    head = {
        "table_id": m.table_id if m.table_id is not None else m.table,
        "version": m.version,
        "since_version": m.since_version,
        "filters": sorted(list(f) for f in m.filters),
        "selector": list(m.selector) if m.selector else None,
    }
    h.update(_canonical(head))
    for f in m.files:
        h.update(b"\n")
        h.update(_canonical([f.path, f.size, f.deletion_vector, [list(r) for r in f.ranges]]))
    return h.hexdigest()


def to_header(m: SplitManifest, files_artifact: str, values_artifact: str | None) -> dict:
    """The JSON-ready header of split ``m``: everything but its files, which ``files_artifact``
    (a path beside the header) holds; ``values_artifact`` holds its lineage columns' values."""
    return {
        "split": m.split,
        "table": m.table,
        "table_id": m.table_id,
        "format": m.format,
        "version": m.version,
        "since_version": m.since_version,
        "filters": [list(f) for f in m.filters],
        "selector": list(m.selector) if m.selector else None,
        "rows": m.rows,
        "num_files": len(m.files),
        "row_tracking": m.row_tracking,
        "fingerprint": fingerprint(m),
        "files": files_artifact,
        "lineage_columns": list(m.lineage_columns),
        "values": values_artifact,
    }


def files_table(m: SplitManifest) -> pa.Table:
    """Split ``m``'s files as a table: one row a file, its runs as flat ``[lo, hi, lo, hi...]``."""
    return pa.table(
        {
            "path": pa.array([f.path for f in m.files], pa.string()),
            "size": pa.array([f.size for f in m.files], pa.int64()),
            "deletion_vector": pa.array(
                [
                    None if f.deletion_vector is None else _canonical(f.deletion_vector).decode()
                    for f in m.files
                ],
                pa.string(),
            ),
            "base_row_id": pa.array([f.base_row_id for f in m.files], pa.int64()),
            "ranges": pa.array(
                [[v for r in f.ranges for v in r] for f in m.files], pa.list_(pa.int64())
            ),
        }
    )


def from_header(header: dict, files: pa.Table) -> SplitManifest:
    """The split manifest stored as ``header`` and its ``files`` table (see :func:`to_header`)."""
    out = []
    columns = files.to_pydict()
    for path, size, dv, base, flat in zip(
        columns["path"],
        columns["size"],
        columns["deletion_vector"],
        columns["base_row_id"],
        columns["ranges"],
        strict=True,
    ):
        ranges = tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
        out.append(FileRows(path, size, None if dv is None else json.loads(dv), base, ranges))
    m = SplitManifest(
        split=header["split"],
        table=header["table"],
        table_id=header["table_id"],
        format=header["format"],
        version=header["version"],
        since_version=header["since_version"],
        filters=tuple(tuple(f) for f in header["filters"]),
        selector=tuple(header["selector"]) if header["selector"] else None,
        files=tuple(out),
        lineage_columns=tuple(header.get("lineage_columns") or ()),
    )
    return m


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
