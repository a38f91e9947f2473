"""Checkpoints on object storage: uploaded, then made to count by a manifest written last.

An object store has no rename, so a local run directory's recipe (write a temporary name, then
rename it) does not carry over. With ``runtime.run_dir`` on ``s3://``, a checkpoint is written
to a local temporary folder exactly as on a local disk, uploaded file by file, and then
``ckpt-N.json``, its manifest (each file's name, size and SHA-256), is written in one PUT.

- **A checkpoint counts only when its manifest exists and its files match it** (sizes when
  listing, SHA-256 when loading). A kill at any moment leaves either a counted checkpoint, or
  files without a manifest, which resume ignores.
- **Pruning** keeps the newest ``keep`` counted checkpoints, deletes an older one manifest
  first (so a half-deleted checkpoint no longer counts), and deletes files without a manifest
  only when they are older than the newest counted checkpoint: the newest valid checkpoint is
  never removed.

One writer per run directory is guaranteed by the run lease (:class:`keras_dl.runlock.S3Lease`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from keras_dl import storage

_FILE = re.compile(r"^ckpt-(\d{9})\.(npz|json)$")
_CHUNK = 8 << 20


def is_remote(directory) -> bool:
    """True for a URI (``s3://...``), False for a local path or ``file://``."""
    return storage.local_path(str(directory)) is None


def manifest_name(name: str) -> str:
    """``ckpt-N.json`` for ``ckpt-N.npz``."""
    return name.rsplit(".", 1)[0] + ".json"


def publish(local_file: Path, directory: str) -> str:
    """Upload ``local_file`` into ``directory``, then its manifest; return the checkpoint's URI."""
    fs, root = storage.filesystem(directory)
    name = local_file.name
    digest, size = hashlib.sha256(), 0
    with open(local_file, "rb") as src, fs.open_output_stream(f"{root.rstrip('/')}/{name}") as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
    manifest = {"files": {name: {"size": size, "sha256": digest.hexdigest()}}}
    storage.write_atomic(
        storage.join(directory, manifest_name(name)), json.dumps(manifest).encode()
    )
    return storage.join(directory, name)


def list_valid(directory: str) -> list[str]:
    """URIs of the checkpoints in ``directory`` whose manifest exists and matches, oldest first."""
    return [storage.join(directory, n) for n in _valid(directory, storage.list_files(directory))]


def read_verified(uri: str) -> bytes:
    """The bytes of the checkpoint at ``uri``, checked against its manifest.

    Raises:
        ValueError: The manifest is missing, or the file's size or SHA-256 differ from it.
    """
    directory, name = uri.rsplit("/", 1)
    meta = (_read_manifest(storage.join(directory, manifest_name(name))) or {}).get(name)
    if meta is None:
        raise ValueError(f"{uri} has no manifest: its upload did not finish.")
    data = storage.read_file(uri)
    if len(data) != meta.get("size") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        raise ValueError(
            f"{uri} does not match its manifest ({len(data)} bytes; the manifest says "
            f"{meta.get('size')} and another SHA-256)."
        )
    return data


def prune(directory: str, keep: int) -> None:
    """Keep the newest ``keep`` valid checkpoints; delete older ones and older partial files."""
    files = storage.list_files(directory)
    valid = _valid(directory, files)
    if not valid:
        return  # nothing counts yet: every file may still become (or be) the only checkpoint
    newest, kept = _step(valid[-1]), set(valid[-keep:])
    doomed = [
        n for n in files if _FILE.match(n) and _step(n) < newest and _data_name(n) not in kept
    ]
    # Manifests first: a checkpoint interrupted mid-deletion then no longer counts.
    for name in sorted(doomed, key=lambda n: not n.endswith(".json")):
        storage.remove(storage.join(directory, name))


def remove_all(directory: str, *extra: str) -> None:
    """Delete every checkpoint file in ``directory`` (manifests first) and the ``extra`` names."""
    names = [n for n in storage.list_files(directory) if _FILE.match(n)]
    for name in [*sorted(names, key=lambda n: not n.endswith(".json")), *extra]:
        storage.remove(storage.join(directory, name))


def set_aside(directory: str) -> int:
    """Move every checkpoint file to ``directory/previous/`` (replacing what was there)."""
    aside = storage.join(directory, "previous")
    remove_all(aside)
    names = [n for n in storage.list_files(directory) if _FILE.match(n)]
    fs, root = storage.filesystem(directory)
    for name in sorted(names, key=lambda n: not n.endswith(".json")):
        fs.move(f"{root.rstrip('/')}/{name}", f"{root.rstrip('/')}/previous/{name}")
    return len([n for n in names if n.endswith(".npz")])


def exists(uri: str) -> bool:
    """True when the object ``uri`` exists."""
    directory, name = uri.rstrip("/").rsplit("/", 1)
    return name in storage.list_files(directory)


def any_files(directory: str) -> bool:
    """True when ``directory`` holds at least one object."""
    return bool(storage.list_files(directory))


# -- private helpers ---------------------------------------------------------------------------


def _valid(directory: str, files: dict[str, int]) -> list[str]:
    out = []
    for name in sorted(files):
        if not name.endswith(".json") or not _FILE.match(name):
            continue
        listed = _read_manifest(storage.join(directory, name)) or {}
        if listed and all(files.get(f) == meta.get("size") for f, meta in listed.items()):
            out.append(_data_name(name))
    return out


def _read_manifest(uri: str) -> dict | None:
    try:
        return json.loads(storage.read_file(uri))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _data_name(name: str) -> str:
    return name.rsplit(".", 1)[0] + ".npz"


def _step(name: str) -> int:
    return int(_FILE.match(name).group(1))
