"""One folder, on a local disk or an object store, behind one interface.

Everything that touches a run folder (``runtime.run_dir``: ``config.yaml``, ``run.json``,
``FINISHING.json``, ``COMPLETE``, the checkpoints and their manifests) goes through a
:class:`Store`, so no caller asks "local or object store?":

- :meth:`Store.write` is atomic: a reader sees the old file, or all of the new one. Locally a
  temporary file in the same folder is fsynced and renamed over the target, and the folder is
  fsynced. On an object store it is one PUT, which the store makes visible whole.
- :meth:`Store.upload` copies a local file in the same way and returns its size and SHA-256,
  for manifests.
- :meth:`Store.read` raises ``FileNotFoundError`` for a missing file on both.

:func:`open_store` picks the implementation from the URI: a local path or ``file://`` gives a
:class:`LocalStore`, anything else (``s3://``) an :class:`ObjectStore`.
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from typing import Any

from keras_dl.storage.files import fsync_dir, join, list_files, read_file, remove, write_atomic
from keras_dl.storage.filesystems import filesystem, local_path

_CHUNK = 8 << 20


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

    @abstractmethod
    def upload(self, local_file: str | os.PathLike, name: str) -> tuple[int, str]:
        """Copy a local file in as ``name``, atomically; return its size and SHA-256."""


class LocalStore(Store):
    """A folder on a local (or mounted) disk."""

    def exists(self, name: str) -> bool:
        return os.path.isfile(self.path(name))

    def upload(self, local_file, name):
        os.makedirs(self.uri, exist_ok=True)
        target = self.path(name)
        tmp = f"{target}.{os.getpid()}.tmp"
        try:
            digest, size = _copy(local_file, lambda: open(tmp, "wb"), fsync=True)  # noqa: SIM115
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        fsync_dir(self.uri)
        return size, digest


class ObjectStore(Store):
    """A prefix on an object store (``s3://bucket/prefix``): one PUT per file, no rename."""

    def upload(self, local_file, name):
        fs, path = filesystem(self.path(name))
        return _copy(local_file, lambda: fs.open_output_stream(path), fsync=False)[::-1]


def open_store(uri: str | os.PathLike) -> Store:
    """The :class:`Store` for a local path, ``file://`` URI or object-store URI."""
    text = os.fspath(uri)
    local = local_path(text)
    if local is not None:
        return LocalStore(os.path.abspath(local))
    return ObjectStore(text.rstrip("/"))


def _copy(local_file, open_target, fsync: bool) -> tuple[str, int]:
    """Stream ``local_file`` into the target; ``(sha256, size)``."""
    digest, size = hashlib.sha256(), 0
    with open(local_file, "rb") as src, open_target() as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
        if fsync:
            dst.flush()
            os.fsync(dst.fileno())
    return digest.hexdigest(), size


__all__ = ["LocalStore", "ObjectStore", "Store", "open_store"]
