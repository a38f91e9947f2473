"""Checkpoints in a Store: copied in whole, then made to count by a manifest written last.

The same protocol on a local disk and on an object store (which has no rename):

- **Save.** The payload (:mod:`keras_dl.checkpoints.state`) is written to a local temporary
  file and copied in as ``ckpt-N.npz`` with :meth:`~keras_dl.storage.Store.upload` (locally a
  fsynced temporary file renamed into place; one PUT on an object store). Then ``ckpt-N.json``,
  its manifest (the file's size and SHA-256), is written with
  :meth:`~keras_dl.storage.Store.write`.
- **Count.** A checkpoint counts only when its manifest exists and the file's size matches it.
  Loading it, or reading its header, checks the SHA-256 too. A kill at any moment leaves a
  counted checkpoint, or files without a manifest, which resume does not count.
- **Prune.** The newest ``keep`` counted checkpoints stay. An older one is deleted manifest
  first, so a half-deleted checkpoint no longer counts. Files without a manifest are deleted
  only when they are older than the newest counted checkpoint, so the newest valid checkpoint
  is never removed.
- **Written before manifests.** keras_dl used to make a local checkpoint whole by renaming it
  into place, with no manifest. Such a file still counts, when its header carries no
  ``format`` and every member of it reads back (each is CRC-checked), and
  :meth:`Checkpoints.adopt_legacy` writes its manifest. A file without a manifest that this
  version wrote (``format`` 2) never counts: its manifest was never written.
- **COMPLETE** marks the training over, with its last step. ``FINISHING.json`` (see
  :mod:`keras_dl.run.finish`) goes with the checkpoints it belongs to.

One writer per folder is the run lock's or lease's job (:mod:`keras_dl.runlock`).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator

from keras_dl.checkpoints.state import read_state, restore_state, write_state
from keras_dl.storage import Store, open_store

COMPLETE = "COMPLETE"  # marker: the training is over, nothing to resume
FINISHING = "FINISHING.json"  # the post-training steps done so far (see keras_dl.run.finish)
PREVIOUS = "previous"  # where checkpoints that cannot be resumed are set aside

_DATA = re.compile(r"^ckpt-(\d{9})\.npz$")
_FILE = re.compile(r"^ckpt-(\d{9})\.(npz|json)$")
_LEGACY_TEMPORARY = re.compile(r"^\.ckpt-\d{9}\.npz\.tmp-\d+$")  # the rename-based writer's


def checkpoint_name(step: int) -> str:
    """``ckpt-000000012.npz`` for global step 12."""
    return f"ckpt-{int(step):09d}.npz"


def manifest_name(name: str) -> str:
    """``ckpt-N.json`` for ``ckpt-N.npz``."""
    return name.rsplit(".", 1)[0] + ".json"


class Checkpoints:
    """The checkpoints in one folder (a :class:`~keras_dl.storage.Store`, a path or a URI).

    Args:
        store: The folder.
        keep: Counted checkpoints kept by :meth:`prune`. Defaults to 3.
    """

    def __init__(self, store: Store | str | os.PathLike, keep: int = 3):
        if keep < 1:
            raise ValueError(f"Checkpoint keep must be >= 1, got {keep}.")
        self.store = store if isinstance(store, Store) else open_store(store)
        self.keep = keep
        # (name, size) of files without a manifest -> (why it does not count or None, SHA-256)
        self._unmanifested: dict[tuple[str, int], tuple[str | None, str | None]] = {}

    def __repr__(self) -> str:
        return f"Checkpoints({self.store.uri!r}, keep={self.keep})"

    @property
    def uri(self) -> str:
        return self.store.uri

    # -- reading -----------------------------------------------------------------------------
    def list(self) -> list[str]:
        """The names of the checkpoints that count, oldest first."""
        return self._scan(self.store.list())[0]

    def uncounted(self) -> dict[str, str]:
        """``{name: why it does not count}`` for the other ``ckpt-N.npz`` files."""
        return self._scan(self.store.list())[1]

    def read_header(self, name: str) -> dict:
        """The JSON header of checkpoint ``name``, its file checked against its manifest.

        Raises:
            ValueError: It does not match its manifest, or it has none and was not written
                before manifests.
            FileNotFoundError, OSError, zipfile.BadZipFile: It is missing, partial or corrupt.
        """
        with self._fetch(name) as local:
            return read_state(local)[0]

    def newest_header(self) -> dict | None:
        """The header of the newest counted checkpoint that reads back (None when none does)."""
        for name in reversed(self.list()):
            with contextlib.suppress(Exception):
                return self.read_header(name)
        return None

    def load(self, name: str, model) -> dict:
        """Restore checkpoint ``name`` into ``model`` (checked as :meth:`read_header` checks it).

        Raises:
            ValueError: As :meth:`read_header`, or its variables do not fit the model's.
        """
        with self._fetch(name) as local:
            return restore_state(local, model, label=self.store.path(name))

    # -- writing -----------------------------------------------------------------------------
    def save(self, step: int, model, header: dict) -> str:
        """Checkpoint ``model`` as global step ``step`` (see the module docstring), then prune.

        Returns:
            The checkpoint's name.
        """
        name = checkpoint_name(step)
        self.store.remove(manifest_name(name))  # one being replaced stops counting first
        with tempfile.TemporaryDirectory(prefix="keras_dl-ckpt-") as tmp:
            local = os.path.join(tmp, name)
            write_state(local, model, header)
            size, digest = self.store.upload(local, name)
        self._write_manifest(name, size, digest)
        self.prune()
        return name

    def adopt_legacy(self) -> list[str]:
        """Write the manifests of the counted checkpoints written before manifests; their names."""
        files = self.store.list()
        adopted = []
        for name in self._scan(files)[0]:
            if manifest_name(name) not in files:
                self._write_manifest(name, files[name], self._unmanifested[name, files[name]][1])
                adopted.append(name)
        return adopted

    def prune(self) -> list[str]:
        """Delete what the protocol no longer needs (see the module docstring); the names."""
        files = self.store.list()
        counted = self._scan(files)[0]
        if not counted:
            return []  # nothing counts yet: every file may still become the only checkpoint
        newest, kept = _step(counted[-1]), set(counted[-self.keep :])
        doomed = [
            n
            for n in files
            if _FILE.match(n) and _step(n) < newest and n.rsplit(".", 1)[0] + ".npz" not in kept
        ]
        return self._remove(doomed)

    def remove_temporaries(self) -> list[str]:
        """Delete the partial files writers killed mid-write left (this version's and the
        rename-based writer's ``.ckpt-N.npz.tmp-PID``); their names."""
        names = self.store.remove_temporaries()
        return names + self._remove([n for n in self.store.list() if _LEGACY_TEMPORARY.match(n)])

    def clear(self) -> None:
        """Delete every checkpoint, the temporaries, ``COMPLETE`` and ``FINISHING.json``."""
        self._remove([n for n in self.store.list() if _FILE.match(n)])
        self.remove_temporaries()
        self.store.remove(COMPLETE)
        self.store.remove(FINISHING)

    def set_aside(self) -> int:
        """Move every checkpoint file into ``previous/`` (replacing the checkpoints there) and
        delete ``FINISHING.json``. Returns the number of checkpoints moved."""
        aside = self.store.child(PREVIOUS)
        Checkpoints(aside)._remove([n for n in aside.list() if _FILE.match(n)])
        names = _manifests_first([n for n in self.store.list() if _FILE.match(n)])
        for name in names:
            self.store.move(name, aside)
        self.store.remove(FINISHING)  # it belonged to those checkpoints
        return sum(1 for n in names if _DATA.match(n))

    # -- COMPLETE ----------------------------------------------------------------------------
    def is_complete(self) -> bool:
        """True when the training that wrote this folder finished."""
        return self.store.exists(COMPLETE)

    def mark_complete(self, global_step: int) -> None:
        """Mark the training complete at ``global_step`` (one atomic write)."""
        self.store.write_json(COMPLETE, {"global_step": int(global_step)})

    def completed_step(self) -> int | None:
        """The global step :meth:`mark_complete` recorded (None when absent or not recorded)."""
        value = self.store.read_json(COMPLETE)
        step = value.get("global_step") if isinstance(value, dict) else None
        return step if isinstance(step, int) else None

    # -- internals ---------------------------------------------------------------------------
    def _scan(self, files: dict[str, int]) -> tuple[list[str], dict[str, str]]:
        """``(counted names oldest first, {other ckpt-N.npz: why not})`` of a listing."""
        counted, others = [], {}
        for name in sorted(n for n in files if _DATA.match(n)):
            size = files[name]
            if manifest_name(name) in files:
                listed = (self._manifest(name) or {}).get("size")
                if listed == size:
                    counted.append(name)
                else:
                    others[name] = f"{size} bytes where its manifest says {listed}"
                continue
            key = (name, size)
            if key not in self._unmanifested:
                self._unmanifested[key] = self._check_unmanifested(name)
            why = self._unmanifested[key][0]
            if why is None:
                counted.append(name)
            else:
                others[name] = why
        return counted, others

    def _check_unmanifested(self, name: str) -> tuple[str | None, str | None]:
        """``(None, sha256)`` for a whole checkpoint written before manifests; else
        ``(why it does not count, None)``."""
        with tempfile.TemporaryDirectory(prefix="keras_dl-ckpt-") as tmp:
            local = os.path.join(tmp, name)
            try:
                digest = self.store.download(name, local)[1]
                header = read_state(local)[0]
            except Exception as exc:
                return f"no manifest, and it does not read back: {exc}", None
        if "format" in header:
            return "no manifest: its upload or its manifest did not finish", None
        return None, digest

    @contextlib.contextmanager
    def _fetch(self, name: str) -> Iterator[str]:
        """A local copy of checkpoint ``name``, checked against its manifest."""
        uri = self.store.path(name)
        with tempfile.TemporaryDirectory(prefix="keras_dl-ckpt-") as tmp:
            local = os.path.join(tmp, name)
            size, digest = self.store.download(name, local)
            listed = self._manifest(name)
            if listed is None:
                if "format" in read_state(local)[0]:  # not written before manifests
                    raise ValueError(f"{uri} has no manifest: its upload did not finish.")
            elif (size, digest) != (listed.get("size"), listed.get("sha256")):
                raise ValueError(
                    f"{uri} does not match its manifest ({size} bytes; the manifest says "
                    f"{listed.get('size')} and another SHA-256)."
                )
            yield local

    def _manifest(self, name: str) -> dict | None:
        """What ``name``'s manifest says of it (size, sha256); None without a readable one."""
        value = self.store.read_json(manifest_name(name))
        files = value.get("files") if isinstance(value, dict) else None
        entry = files.get(name) if isinstance(files, dict) else None
        return entry if isinstance(entry, dict) else None

    def _write_manifest(self, name: str, size: int, digest: str) -> None:
        self.store.write_json(
            manifest_name(name), {"files": {name: {"size": size, "sha256": digest}}}
        )

    def _remove(self, names: list[str]) -> list[str]:
        ordered = _manifests_first(names)  # a half-removed checkpoint no longer counts
        for name in ordered:
            self.store.remove(name)
        return ordered


def _manifests_first(names) -> list[str]:
    return sorted(names, key=lambda n: (not n.endswith(".json"), n))


def _step(name: str) -> int:
    return int(_FILE.match(name).group(1))
