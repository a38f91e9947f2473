"""The legacy ``pq.ParquetDataset``/``pq.ParquetDatasetPiece`` that Petastorm 0.13.1 reads with.

pyarrow 15 removed the legacy dataset: ``ParquetDataset(validate_schema=, metadata_nthreads=)``,
its ``.pieces``, ``.partitions``, ``.common_metadata``, ``.metadata``, ``.fs`` and
``pq.ParquetDatasetPiece``. Petastorm calls them at ``reader.py:431``,
``arrow_reader_worker.py:164``, ``py_dict_reader_worker.py:138``, ``etl/dataset_metadata.py:107,
117, 288, 325, 334, 402``, ``etl/rowgroup_indexing.py:54, 100``, ``etl/metadata_util.py:50`` and
``etl/petastorm_generate_metadata.py:66``, all through their module-level ``pq``.

This module stands in for those modules' ``pq`` (and only theirs: :func:`patch_module` swaps
the reference; ``pyarrow.parquet`` itself is untouched). It defines the legacy classes, covering
only what Petastorm uses, and hands every other name to ``pyarrow.parquet``. Files are found
with ``pyarrow.dataset`` (which skips ``_*`` and ``.*`` files such as ``_SUCCESS`` and Spark's
``.crc``) and read with ``pq.ParquetFile``, as the legacy pieces did. Order, as legacy had it:
a list of files keeps the order given; a directory is walked sorted, level by level.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Collection
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as _pq


def needed() -> bool:
    """True where pyarrow no longer has the legacy dataset (15 and later)."""
    return not hasattr(_pq, "ParquetDatasetPiece")


def patch_module(module) -> bool:
    """Point ``module.pq`` here if it is ``pyarrow.parquet`` and pyarrow lacks the legacy classes."""
    if needed() and getattr(module, "pq", None) is _pq:
        module.pq = _this()
        return True
    return False


def __getattr__(name):  # ParquetFile, read_metadata, write_metadata...: pyarrow's own
    return getattr(_pq, name)


_OPEN = partial(open, mode="rb")  # the legacy default opener


class ParquetDatasetPiece:
    """One Parquet file, or one row group of it, plus its hive partition keys.

    Args:
        path: The file's path on the dataset's filesystem.
        open_file_func: Opens ``path`` for reading. Defaults to Python's ``open``.
        file_options: Keyword arguments for ``pq.ParquetFile``. Defaults to verifying page
            checksums (``page_checksum_verification=True``).
        row_group: The row group to read, or None for the whole file.
        partition_keys: ``(name, index into the partition's keys)`` per directory level.
    """

    def __init__(self, path, open_file_func=_OPEN, file_options=None,
                 row_group=None, partition_keys=None):  # fmt: skip
        self.path = str(path)
        self.open_file_func = open_file_func
        # Pages are checked against their CRC checksums where the file has them.
        self.file_options = {"page_checksum_verification": True, **(file_options or {})}
        self.row_group = row_group
        self.partition_keys = partition_keys or []

    def __eq__(self, other):
        return isinstance(other, ParquetDatasetPiece) and (
            self.path,
            self.row_group,
            self.partition_keys,
        ) == (other.path, other.row_group, other.partition_keys)

    def __hash__(self):
        return hash((self.path, self.row_group))

    def __repr__(self):
        return (
            f"ParquetDatasetPiece({self.path!r}, row_group={self.row_group!r}, "
            f"partition_keys={self.partition_keys!r})"
        )

    def get_metadata(self):
        """The file's Parquet footer."""
        with self.open_file_func(self.path) as f:
            return _pq.ParquetFile(f, **self.file_options).metadata

    def read(self, columns=None, use_threads=True, partitions=None, file=None,
             use_pandas_metadata=False):  # fmt: skip
        """Read the piece; partition keys become dictionary columns, as the legacy piece did."""
        source = file if file is not None else self.open_file_func(self.path)
        try:
            reader = _pq.ParquetFile(source, **self.file_options)
            options = dict(
                columns=columns, use_threads=use_threads, use_pandas_metadata=use_pandas_metadata
            )
            if self.row_group is not None:
                table = reader.read_row_group(self.row_group, **options)
            else:
                table = reader.read(**options)
        finally:
            if file is None:
                source.close()
        if self.partition_keys and partitions is None:
            raise ValueError("Must pass partition sets")
        for level, (name, index) in enumerate(self.partition_keys):
            indices = np.full(len(table), index, dtype="i4")
            dictionary = partitions.levels[level].dictionary
            table = table.append_column(name, pa.DictionaryArray.from_arrays(indices, dictionary))
        return table


class PartitionSet:
    """The distinct values of one partition level, in discovery order (``keys``)."""

    def __init__(self, name, keys=None):
        self.name = name
        self.keys = list(keys or [])
        self.key_indices = {k: i for i, k in enumerate(self.keys)}

    def get_index(self, key) -> int:
        if key not in self.key_indices:
            self.key_indices[key] = len(self.keys)
            self.keys.append(key)
        return self.key_indices[key]

    @property
    def dictionary(self) -> pa.Array:
        """The values as integers if all of them parse as integers, else as strings (legacy)."""
        try:
            return pa.array([int(k) for k in self.keys])
        except ValueError:
            return pa.array(self.keys)


class ParquetPartitions:
    """The hive partition levels of a directory dataset (``levels``, ``partition_names``)."""

    def __init__(self):
        self.levels: list[PartitionSet] = []
        self.partition_names: set[str] = set()

    def __len__(self):
        return len(self.levels)

    def __getitem__(self, i):
        return self.levels[i]

    def get_index(self, level, name, key) -> int:
        if level == len(self.levels):
            if name in self.partition_names:
                raise ValueError(f"{name} was the name of the partition in another level")
            self.levels.append(PartitionSet(name))
            self.partition_names.add(name)
        return self.levels[level].get_index(key)

    def filter_accepts_partition(self, part_key, filter, level) -> bool:
        """Whether one ``(column, op, value)`` filter accepts a piece's key at ``level``."""
        p_column, p_index = part_key
        f_column, op, f_value = filter
        if p_column != f_column:
            return True
        f_type = type(f_value)
        if op in ("in", "not in"):
            if not isinstance(f_value, Collection) or not f_value:
                raise ValueError(f"Filter {filter!r}: 'in' needs a non-empty collection")
            f_type = type(next(iter(f_value)))
        p_value = f_type(self.levels[level].dictionary[p_index].as_py())
        compare = _OPS.get(op)
        if compare is None:
            raise ValueError(f"{op!r} is not a valid operator in filter {filter!r}")
        return compare(p_value, f_value)


class ParquetDataset:
    """A directory, a file or a list of files of Parquet, as the legacy ``pq.ParquetDataset``.

    Args:
        path_or_paths: A directory (hive partitions allowed), one file, or a list of files.
        filesystem: A legacy-style filesystem (``pyarrow.localfs``, an fsspec filesystem) or a
            ``pyarrow.fs.FileSystem``. Defaults to the local filesystem.
        filters: DNF filters (``[(col, op, value), ...]`` or a list of those). As in the
            legacy dataset they prune hive partitions only, never rows.
        validate_schema: Accepted and ignored (Petastorm always passes False).
        metadata_nthreads: Accepted and ignored.
    """

    def __init__(self, path_or_paths, filesystem=None, schema=None, metadata=None,
                 split_row_groups=False, validate_schema=True, filters=None,
                 metadata_nthreads=None, **_ignored):  # fmt: skip
        from keras_dl.data.petastorm_compat.filesystem import FileSystem, LocalFileSystem

        if filesystem is None:
            filesystem = LocalFileSystem.get_instance()
        elif isinstance(filesystem, pafs.FileSystem):
            filesystem = FileSystem(filesystem)
        self.fs = filesystem
        self._arrow_fs = _arrow_fs(filesystem)
        self.partitions = None
        self.metadata_path = self.common_metadata_path = None
        if isinstance(path_or_paths, (list, tuple)):
            self.paths = [str(p) for p in path_or_paths]
            self.pieces = [self._piece(p) for p in self.paths]
        else:
            self.paths = str(path_or_paths)
            info = self._arrow_fs.get_file_info(self.paths)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"Parquet dataset {self.paths!r} does not exist")
            if info.type == pafs.FileType.File:
                self.pieces = [self._piece(self.paths)]
            else:
                self.pieces = self._discover(self.paths)
        if filters:
            self.pieces = self._filter(self.pieces, filters)
        if self.common_metadata_path is None:
            # pyarrow 12's legacy ParquetManifest (parquet/core.py:1493): "_common_metadata is a
            # subset of _metadata", so a dataset with only _metadata serves it as both.
            self.common_metadata_path = self.metadata_path
        self.common_metadata = self._read_footer(self.common_metadata_path)
        self.metadata = metadata or self._read_footer(self.metadata_path)
        self._schema = schema

    @property
    def schema(self):
        """The Parquet schema: ``_common_metadata``'s, ``_metadata``'s or the first file's."""
        if self._schema is None:
            footer = self.common_metadata or self.metadata or self.pieces[0].get_metadata()
            self._schema = footer.schema
        return self._schema

    def _piece(self, path, partition_keys=None) -> ParquetDatasetPiece:
        return ParquetDatasetPiece(path, open_file_func=self.fs.open, partition_keys=partition_keys)

    def _discover(self, root: str) -> list[ParquetDatasetPiece]:
        root = root.rstrip("/") or "/"
        for name, attr in (("_common_metadata", "common_metadata_path"), ("_metadata", "metadata_path")):  # fmt: skip
            path = f"{root}/{name}"
            if self._arrow_fs.get_file_info(path).type == pafs.FileType.File:
                setattr(self, attr, path)
        files = ds.dataset(root, filesystem=self._arrow_fs, format="parquet").files
        # Legacy order: each directory level sorted, then its files sorted.
        files = sorted(files, key=lambda p: os.path.relpath(p, root).split("/"))
        partitions = ParquetPartitions()
        pieces = []
        for path in files:
            keys = []
            for level, part in enumerate(os.path.relpath(path, root).split("/")[:-1]):
                if "=" not in part:
                    raise ValueError(
                        f"Directory {part!r} in Parquet dataset {root!r} is not a hive partition "
                        "(name=value): point Petastorm at the files or at the partitioned root."
                    )
                name, value = part.split("=", 1)
                keys.append((name, partitions.get_index(level, name, value)))
            pieces.append(self._piece(path, keys))
        self.partitions = partitions if len(partitions) else None
        return pieces

    def _filter(self, pieces, filters):
        if self.partitions is None:
            return pieces  # legacy: filters prune partitions only; files have none here
        if isinstance(filters[0][0], str):
            filters = [filters]  # a single conjunction

        def accepts(piece, conjunction):
            return all(
                self.partitions.filter_accepts_partition(key, f, level)
                for f in conjunction
                for level, key in enumerate(piece.partition_keys)
            )

        return [p for p in pieces if any(accepts(p, c) for c in filters)]

    def _read_footer(self, path):
        if path is None:
            return None
        with self.fs.open(path) as f:
            return _pq.read_metadata(f)


_OPS = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "in": lambda value, values: value in values,
    "not in": lambda value, values: value not in values,
}


def _arrow_fs(filesystem) -> pafs.FileSystem:
    """The ``pyarrow.fs`` filesystem behind a legacy-style or fsspec filesystem."""
    if hasattr(filesystem, "arrow_fs"):
        return filesystem.arrow_fs
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec comes with Petastorm
        fsspec = None
    if fsspec is not None and isinstance(filesystem, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    raise TypeError(
        f"Petastorm passed a filesystem keras_dl's ParquetDataset does not know: {filesystem!r}. "
        "Pass a pyarrow.fs.FileSystem or an fsspec filesystem."
    )


def _this():
    import sys

    return sys.modules[__name__]
