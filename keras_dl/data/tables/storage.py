"""Where a table's bytes live: a local path or a URI, opened through ``pyarrow.fs``.

Table readers list folders and read files and byte ranges through :class:`Storage`, so the same
code reads a local disk and an object store. Local paths are made absolute; ``file://`` URIs are
treated as local paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Storage:
    """A filesystem and the root path of one table on it."""

    fs: Any  # pyarrow.fs.FileSystem
    root: str  # the table's root on ``fs`` (no scheme)
    uri: str  # the table as users name it: an absolute local path, or the URI

    def path(self, relative: str) -> str:
        """The path on ``fs`` of a file named relative to the table's root."""
        return f"{self.root.rstrip('/')}/{relative}" if relative else self.root

    def list(self, relative: str = "") -> list[tuple[str, int | None]]:
        """``(name, mtime_ms)`` of the files directly in a folder (none when it is missing)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path(relative), allow_not_found=True)
        out = []
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                mtime = None if info.mtime_ns is None else info.mtime_ns // 1_000_000
                out.append((info.base_name, mtime))
        return out

    def is_dir(self, relative: str = "") -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path(relative)).type == pafs.FileType.Directory

    def read_text(self, relative: str) -> str:
        with self.fs.open_input_stream(self.path(relative)) as f:
            return f.read().decode("utf-8")

    def read_bytes(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of the file at ``path`` (a path on ``fs``)."""
        with self.fs.open_input_file(path) as f:
            f.seek(offset)
            return f.read(length)

    def file_uri(self, path: str) -> str:
        """A URI (or absolute local path) for a path on ``fs``, as the reader is given it."""
        scheme = self.uri.split("://", 1)[0] if "://" in self.uri else ""
        return f"{scheme}://{path}" if scheme else path

    def strip(self, uri: str) -> str:
        """The path on ``fs`` of an absolute URI or local path."""
        if uri.startswith("file://"):
            return uri[len("file://") :]
        return uri.split("://", 1)[1] if "://" in uri else uri


def open_storage(table: str) -> Storage:
    """The filesystem and root of ``table`` (a local path, ``file://`` or another URI)."""
    import pyarrow.fs as pafs

    local = local_path(table)
    if local is not None:
        root = os.path.abspath(local)
        return Storage(pafs.LocalFileSystem(), root, root)
    fs, root = pafs.FileSystem.from_uri(table)
    return Storage(fs, root.rstrip("/"), table.rstrip("/"))


def local_path(table: str) -> str | None:
    """The local path of ``table``, or None for a remote URI."""
    if table.startswith("file://"):
        return table[len("file://") :]
    return None if "://" in table else table


def file_url(path: str) -> str:
    """A URL Petastorm accepts for a local path or remote URI."""
    # Not Path.as_uri(): it percent-encodes "=" in partition folders, which Petastorm keeps.
    return path if "://" in path else "file://" + os.path.abspath(path)
