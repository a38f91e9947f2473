"""What one read of a table sees: the :class:`TableSnapshot` (no I/O here).

A snapshot fixes *which* rows a run reads, so every rank, every epoch and every split read the
same version of the table. It holds everything the reader needs to return exactly the rows the
table holds at that version, and nothing it must look up again:

- the data files, in a fixed order;
- each file's partition values, already typed by the table's schema (a null is ``None``);
- each file's deleted rows (Delta deletion vectors), as sorted row indexes within the file;
- the logical schema (the names and types users see) and, for Delta column mapping, the
  physical schema (the names and field ids inside the Parquet files);
- the version and the lineage the run records.

Only ``keras_dl.data.tables`` makes snapshots; :func:`keras_dl.data.tables.filters.select` narrows one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

Filter = tuple[str, str, Any]


@dataclass(frozen=True)
class TableSnapshot:
    """The files of one version of a table, with the schema they share.

    Attributes:
        uri: The table as given (absolute for local paths).
        format: "delta", "parquet", "petastorm" (a Unischema dataset, read with make_reader)
            or "mds" (a Mosaic StreamingDataset folder, its shards decoded to Parquet).
        version: The Delta version read, or None for plain Parquet.
        files: Absolute paths or URIs of the data files, in reading order.
        partitions: Each file's partition values, ``{logical column: typed value or None}``.
        schema: Arrow schema of the rows as users see them, partition columns included.
        partition_columns: Columns whose value comes from the file's partition, not its content.
        row_filters: Filters on non-partition columns, applied to every batch as it is read.
        deleted_rows: Per file, the sorted row indexes (within the file) that a deletion vector
            removed, or None when nothing was deleted. Empty for non-Delta tables.
        physical_schema: Per logical column, the field as stored in the Parquet files (Delta
            column mapping: another name, nested names and a field id). None when the files
            use the logical names.
        unischema: Petastorm datasets only: their Unischema (codecs, shapes).
        file_records: Per file, the rows it holds as the Delta log's ``stats.numRecords``
            says (deleted rows included), or None where the log has no statistics. Lets the
            shards be planned without opening any footer. Empty for non-Delta tables.
        file_stats: Per file, the log's column statistics (Delta ``stats``: ``numRecords``,
            ``minValues``, ``maxValues``, ``nullCount``, keyed by physical name; a maximum
            string that may have been cut to a prefix is left out), or None where the log has
            none. Filters skip the files they prove hold no match (:mod:`.skipping`).
        skipped_files: Files the filters skipped by those statistics, never opened.
        data_skipping: Whether filters skip files and row groups by their statistics (False:
            every file and row group is read and filtered row by row, as a baseline).
        since_version: For a change snapshot (``data.since_version``), the version after which
            rows were added: the snapshot holds only the rows versions ``since_version + 1`` to
            ``version`` inserted that are still live. None for a whole table.
        content_version: For an unversioned table whose content has an identity (an MDS
            dataset: its shards' hashes), that identity; lineage records it as
            ``data.version``. None otherwise.
        local_copies: With ``data.cache_dir`` still being filled: what ``resolve(files)``s each
            file already copied to local disk to its copy (see :meth:`with_local_copies`).
            None when every file is read from where ``files`` names it.
        table_id: A Delta table's identity, its ``metaData.id``: a table dropped and written
            again at the same path gets another. None for other formats.
        file_info: Per file, what the log says of it beside its rows (Delta tables only, else
            empty): ``path`` as the log names it (relative to the table, whatever copy is
            read), ``size`` in bytes, ``deletionVector`` (its descriptor, or None) and
            ``baseRowId`` (row tracking: the file's first row id, or None). Row lineage
            (:mod:`keras_dl.lineage`) names the rows a run trained by these.
        row_id_column: Row tracking's materialized row id column
            (``delta.rowTracking.materializedRowIdColumnName``), or None.
    """

    uri: str
    format: str
    version: int | None
    files: tuple[str, ...]
    partitions: tuple[dict[str, Any], ...]
    schema: pa.Schema
    partition_columns: tuple[str, ...] = ()
    row_filters: tuple[Filter, ...] = ()
    deleted_rows: tuple[np.ndarray | None, ...] = field(default=(), compare=False)
    physical_schema: pa.Schema | None = None
    unischema: Any = None
    file_records: tuple[int | None, ...] = field(default=(), compare=False)
    since_version: int | None = None
    file_stats: tuple[dict | None, ...] = field(default=(), compare=False, repr=False)
    skipped_files: int = 0
    data_skipping: bool = True
    content_version: str | None = None
    local_copies: Any = field(default=None, compare=False, repr=False)
    table_id: str | None = None
    file_info: tuple[dict, ...] = field(default=(), compare=False, repr=False)
    row_id_column: str | None = None

    @property
    def read_by_rows(self) -> bool:
        """Rows encoded by codecs (a Petastorm dataset's Unischema): the stream reads them row by
        row with Petastorm's ``make_reader``, not as Arrow row groups. The readers ask this, not
        the format, so a new format is added here in ``tables/`` alone."""
        return self.unischema is not None

    @property
    def versioned(self) -> bool:
        """The table has versions (Delta): ``version`` names the one read."""
        return self.version is not None

    @property
    def lineage(self) -> dict[str, str]:
        """Tags recording what was read: ``data.table``, ``data.version``, ``data.format``, and
        ``data.since_version`` for a change snapshot (the range is since_version to version]."""
        tags = {
            "data.table": self.uri,
            "data.version": str(self.version)
            if self.version is not None
            else self.content_version or "",
            "data.format": self.format,
        }
        if self.since_version is not None:
            tags["data.since_version"] = str(self.since_version)
        return tags

    def take(self, indexes) -> TableSnapshot:
        """The same snapshot with only the files at ``indexes`` (in that order)."""
        keep = list(indexes)

        def pick(values: tuple) -> tuple:
            return tuple(values[i] for i in keep) if values else values

        return replace(
            self,
            files=pick(self.files),
            partitions=pick(self.partitions),
            deleted_rows=pick(self.deleted_rows),
            file_records=pick(self.file_records),
            file_stats=pick(self.file_stats),
            file_info=pick(self.file_info),
        )

    def with_local_copies(self) -> TableSnapshot:
        """The same snapshot reading the local copies ``data.cache_dir`` holds by now (each
        epoch asks again, so the epochs after the cache is filled read local disk)."""
        if self.local_copies is None:
            return self
        return replace(self, files=self.local_copies.resolve(self.files))

    def deletions(self, index: int) -> np.ndarray | None:
        """The deleted row indexes of file ``index`` (None when none were deleted)."""
        return self.deleted_rows[index] if self.deleted_rows else None

    def live_records(self) -> tuple[int, ...] | None:
        """Each file's live rows from the log alone (records less deleted rows), or None when
        the log cannot say (no statistics, or row filters that only a read can apply)."""
        if self.row_filters or not self.files or len(self.file_records) != len(self.files):
            return None
        if any(n is None for n in self.file_records):
            return None
        return tuple(
            int(n) - (0 if self.deletions(i) is None else len(self.deletions(i)))
            for i, n in enumerate(self.file_records)
        )

    def physical_field(self, column: str) -> pa.Field:
        """The Parquet field that stores logical ``column`` (itself without column mapping)."""
        if self.physical_schema is None:
            return self.schema.field(column)
        return self.physical_schema.field(self.schema.get_field_index(column))

    @property
    def data_columns(self) -> list[str]:
        """The logical columns stored in the files (every column but the partition ones)."""
        return [n for n in self.schema.names if n not in self.partition_columns]
