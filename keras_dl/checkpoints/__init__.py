"""Resumable training checkpoints in a run folder, on a local disk or an object store.

- :mod:`~keras_dl.checkpoints.protocol`: :class:`Checkpoints`, the checkpoints of one folder
  (a :class:`~keras_dl.storage.Store`): save, list the ones that count, load them verified,
  prune, clear, set aside, and the ``COMPLETE`` marker. One protocol for both kinds of store: a
  checkpoint counts once its manifest, written last, matches it.
- :mod:`~keras_dl.checkpoints.state`: one checkpoint's payload, a model's whole training state
  in a local ``.npz`` file.

The functions below take a folder (or a checkpoint's path or URI) for callers that hold no
:class:`Checkpoints`.

Example:
    >>> ckpts = Checkpoints("runs/my-model/checkpoints")   # doctest: +SKIP
    >>> ckpts.list()                                        # doctest: +SKIP
    ['ckpt-000000300.npz', 'ckpt-000000400.npz']
    >>> ckpts.read_header("ckpt-000000400.npz")["epoch"]    # doctest: +SKIP
    4
"""

from __future__ import annotations

import os

from keras_dl.checkpoints.protocol import (
    COMPLETE,
    FINISHING,
    PREVIOUS,
    Checkpoints,
    checkpoint_name,
    manifest_name,
)
from keras_dl.checkpoints.state import FORMAT
from keras_dl.storage import Store, store_of


def list_checkpoints(directory: Store | str | os.PathLike) -> list[str]:
    """The paths (or URIs) of the checkpoints in ``directory`` that count, oldest first."""
    ckpts = Checkpoints(directory)
    return [ckpts.store.path(name) for name in ckpts.list()]


def read_header(path: str | os.PathLike) -> dict:
    """The header of the checkpoint at ``path`` (a path or URI), checked against its manifest."""
    store, name = store_of(path)
    return Checkpoints(store).read_header(name)


def is_complete(directory: Store | str | os.PathLike) -> bool:
    """True when the training that wrote ``directory`` finished."""
    return Checkpoints(directory).is_complete()


def mark_complete(directory: Store | str | os.PathLike, global_step: int) -> None:
    """Mark ``directory``'s training complete at ``global_step``: the next run starts fresh."""
    Checkpoints(directory).mark_complete(global_step)


__all__ = [
    "COMPLETE",
    "FINISHING",
    "FORMAT",
    "PREVIOUS",
    "Checkpoints",
    "checkpoint_name",
    "is_complete",
    "list_checkpoints",
    "manifest_name",
    "mark_complete",
    "read_header",
]
