"""One folder, on a local disk or an object store, behind one interface.

Everything that touches a run folder (``runtime.run_dir``: ``config.yaml``, ``run.json``,
``FINISHING.json``, ``COMPLETE``, the checkpoints and their manifests) goes through a
:class:`Store`, so no caller asks "local or object store?":

- :meth:`Store.write` is atomic: a reader sees the old file, or all of the new one. Locally a
  temporary file in the same folder is fsynced and renamed over the target, and the folder is
  fsynced. On an object store it is one PUT, which the store makes visible whole.
- :meth:`Store.upload` copies a local file in the same way and returns its size and SHA-256,
  for manifests; :meth:`Store.download` copies a file out and returns the same two.
- :meth:`Store.move` moves a file into another folder of the same store, and
  :meth:`Store.remove_temporaries` deletes what a local writer killed mid-write left behind.
- :meth:`Store.read` raises ``FileNotFoundError`` for a missing file on both.
- A local write that finds the disk full (ENOSPC, or a quota's EDQUOT) removes its temporary
  file and raises :class:`~keras_dl.errors.RunError` (exit 2) naming the folder, the bytes it
  needed and the fix.

:func:`open_store` picks the implementation from the URI: a local path or ``file://`` gives a
:class:`LocalStore`, anything else (``s3://``) an :class:`ObjectStore`.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from abc import ABC, abstractmethod
from functools import partial
from typing import Any

from keras_dl.storage.files import (
    disk_full_is_run_error,
    fsync_dir,
    join,
    list_files,
    read_file,
    remove,
    write_atomic,
)
from keras_dl.storage.filesystems import filesystem, local_path
from keras_dl.storage.retry import retrying

_CHUNK = 8 << 20
# What write_atomic and LocalStore.upload name a file while writing it: "<name>.<pid>.tmp".
_TEMPORARY = re.compile(r"^.+\.\d+\.tmp$")


class Store(ABC):
    """A folder of whole files. ``uri`` is a local path or an object-store URI."""

    def __init__(self, uri: str):
        self.uri = uri

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash((type(self), self.uri))

    def path(self, name: str) -> str:
        """The local path or URI of the file ``name`` in this folder."""
        return join(self.uri, name)

    def child(self, name: str) -> Store:
        """The sub-folder ``name`` (it need not exist yet)."""
        return type(self)(join(self.uri, name))

    def write(self, name: str, data: bytes) -> None:
        """Write the whole file ``name`` atomically (fsynced on a local disk)."""
        write_atomic(self.path(name), data)

    def read(self, name: str) -> bytes:
        """The bytes of ``name``. Raises ``FileNotFoundError`` when it does not exist."""
        return read_file(self.path(name))

    def list(self) -> dict[str, int]:
        """``{name: size}`` of the files directly in this folder ({} when it is missing)."""
        return list_files(self.uri)

    def exists(self, name: str) -> bool:
        return name in self.list()

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        remove(self.path(name))

    def write_text(self, name: str, text: str) -> None:
        self.write(name, text.encode("utf-8"))

    def read_text(self, name: str) -> str:
        return self.read(name).decode("utf-8")

    def write_json(self, name: str, value: Any) -> None:
        self.write(name, json.dumps(value).encode("utf-8"))

    def read_json(self, name: str, default: Any = None) -> Any:
        """The JSON in ``name``; ``default`` when it is missing or not valid JSON."""
        try:
            return json.loads(self.read(name))
        except (OSError, ValueError):
            return default

    def download(self, name: str, local_file: str | os.PathLike) -> tuple[int, str]:
        """Copy ``name`` out to a local file; return its size and SHA-256.

        Raises ``FileNotFoundError`` when ``name`` does not exist.
        """
        fs, path = filesystem(self.path(name))
        return _copy(partial(fs.open_input_stream, path), partial(open, local_file, "wb"))

    def remove_temporaries(self) -> list[str]:
        """Delete the partial files that writers killed mid-write left here; return their names.

        Only a local folder has any (``<name>.<pid>.tmp``): an object store's writes are single
        PUTs, visible whole or not at all. Call it only while no other process writes here.
        """
        return []

    @abstractmethod
    def upload(self, local_file: str | os.PathLike, name: str) -> tuple[int, str]:
        """Copy a local file in as ``name``, atomically; return its size and SHA-256."""

    @abstractmethod
    def move(self, name: str, to: Store) -> None:
        """Move the file ``name`` into the folder ``to`` (same name; replaces a file there).

        ``to`` must be on the same store (for example :meth:`child`). On an object store a move
        is a copy and a delete: an interrupted one may leave the file in both folders.
        """


class LocalStore(Store):
    """A folder on a local (or mounted) disk."""

    def exists(self, name: str) -> bool:
        return os.path.isfile(self.path(name))

    def upload(self, local_file, name):
        target = self.path(name)
        tmp = f"{target}.{os.getpid()}.tmp"
        try:
            with disk_full_is_run_error(self.uri, name, os.path.getsize(local_file)):
                os.makedirs(self.uri, exist_ok=True)  # a new folder takes a block too
                result = _copy(
                    partial(open, local_file, "rb"), partial(open, tmp, "wb"), fsync=True
                )
                os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):  # a failed write leaves no partial file behind
                os.remove(tmp)
        fsync_dir(self.uri)
        return result

    def download(self, name, local_file):
        return _copy(partial(open, self.path(name), "rb"), partial(open, local_file, "wb"))

    def move(self, name, to):
        _same_kind(self, to)
        os.makedirs(to.uri, exist_ok=True)
        os.replace(self.path(name), to.path(name))
        fsync_dir(to.uri)
        fsync_dir(self.uri)

    def remove_temporaries(self):
        names = [n for n in self.list() if _TEMPORARY.match(n)]
        for name in names:
            self.remove(name)
        return names


class ObjectStore(Store):
    """A prefix on an object store (``s3://bucket/prefix``): one PUT per file, no rename.

    Every call is retried through a transient outage (:func:`~keras_dl.storage.retry.retrying`):
    a whole PUT, GET, listing or delete is safe to repeat.
    """

    def write(self, name, data):
        retrying(lambda: super(ObjectStore, self).write(name, data), self.path(name))

    def read(self, name):
        return retrying(lambda: super(ObjectStore, self).read(name), self.path(name))

    def list(self):
        return retrying(lambda: super(ObjectStore, self).list(), self.uri)

    def remove(self, name):
        retrying(lambda: super(ObjectStore, self).remove(name), self.path(name))

    def download(self, name, local_file):
        return retrying(
            lambda: super(ObjectStore, self).download(name, local_file), self.path(name)
        )

    def upload(self, local_file, name):
        def put():
            fs, path = filesystem(self.path(name))
            return _copy(partial(open, local_file, "rb"), partial(fs.open_output_stream, path))

        return retrying(put, self.path(name))

    def move(self, name, to):
        _same_kind(self, to)

        def move():
            fs, source = filesystem(self.path(name))
            target = filesystem(to.path(name))[1]
            if not _exists(fs, source) and _exists(fs, target):
                return  # an earlier attempt moved it before the store stopped answering
            try:
                fs.move(source, target)
            except NotImplementedError:  # Azure Blob storage without a hierarchical namespace
                fs.copy_file(source, target)
                fs.delete_file(source)

        retrying(move, self.path(name))


def open_store(uri: str | os.PathLike) -> Store:
    """The :class:`Store` for a local path, ``file://`` URI or object-store URI."""
    text = os.fspath(uri)
    local = local_path(text)
    if local is not None:
        return LocalStore(os.path.abspath(local))
    return ObjectStore(text.rstrip("/"))


def store_of(uri: str | os.PathLike) -> tuple[Store, str]:
    """The :class:`Store` of the folder holding the file ``uri``, and the file's name in it."""
    folder, name = posixpath.split(os.fspath(uri).rstrip("/"))
    if not name:
        raise ValueError(f"{uri!r} names no file.")
    return open_store(folder or "."), name


def _copy(open_source, open_target, fsync: bool = False) -> tuple[int, str]:
    """Stream the source into the target; ``(size, sha256)``."""
    digest, size = hashlib.sha256(), 0
    with open_source() as src, open_target() as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
        if fsync:
            dst.flush()
            os.fsync(dst.fileno())
    return size, digest.hexdigest()


def _exists(fs, path: str) -> bool:
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _same_kind(store: Store, to: Store) -> None:
    if type(to) is not type(store):
        raise ValueError(f"Cannot move from {store} to {to}: not on the same store.")


__all__ = ["LocalStore", "ObjectStore", "Store", "open_store", "store_of"]
