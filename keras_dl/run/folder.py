"""A run's folder (``runtime.run_dir``, a local path or an object-store URI), through a Store.

It holds:

- ``config.yaml``: the resolved config of the latest attempt;
- ``run.json``: the MLflow run id and tracking URI, so a rerun continues the same run;
- ``checkpoints/``: the checkpoints and their manifests, ``COMPLETE`` once the training is over,
  and ``FINISHING.json``, the post-training steps done so far (see :mod:`keras_dl.run.finish`).

Every file is written whole (:meth:`keras_dl.storage.Store.write`): after a kill a reader sees
the old file or the new one. A full disk is a :class:`~keras_dl.errors.RunError` (exit 2), and
the partial files a killed or failed writer left are removed before a rerun writes anything
(:meth:`RunFolder.remove_temporaries`), so they cannot keep the disk full. The lock or lease on the folder is :mod:`keras_dl.runlock`'s.
"""

from __future__ import annotations

import os

from keras_dl import config
from keras_dl.checkpoints import FINISHING, Checkpoints
from keras_dl.storage import Store, open_store

CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
CHECKPOINTS = "checkpoints"


class RunFolder:
    """The files of one run folder. Only the chief writes them."""

    def __init__(self, uri: str | os.PathLike):
        self.uri = os.fspath(uri)
        self.store: Store = open_store(self.uri)
        self.checkpoints: Store = self.store.child(CHECKPOINTS)

    def __repr__(self) -> str:
        return f"RunFolder({self.uri!r})"

    def remove_temporaries(self) -> list[str]:
        """Delete the partial files killed writers left here and in ``checkpoints/``; their
        names. Call it before writing anything, while holding the folder's lock."""
        names = self.store.remove_temporaries()
        return names + Checkpoints(self.checkpoints).remove_temporaries()

    def record_config(self, exp) -> None:
        """Write the resolved config as ``config.yaml``."""
        self.store.write_text(CONFIG_FILE, config.dumps(exp))

    def record_run_id(self, run_id: str, tracking_uri: str) -> None:
        """Write ``run.json``: the MLflow run a rerun in this folder continues."""
        self.store.write_json(RUN_FILE, {"run_id": run_id, "tracking_uri": tracking_uri})

    def recorded_run_id(self) -> str | None:
        """The MLflow run id in ``run.json``; None when there is none (or it is unreadable)."""
        record = self.store.read_json(RUN_FILE, default={})
        run_id = record.get("run_id") if isinstance(record, dict) else None
        return run_id if isinstance(run_id, str) else None

    def finishing(self) -> dict:
        """The finishing steps recorded so far ({} when none)."""
        done = self.checkpoints.read_json(FINISHING, default={})
        return done if isinstance(done, dict) else {}

    def record_finishing(self, **values) -> None:
        """Add ``values`` to ``FINISHING.json``."""
        self.checkpoints.write_json(FINISHING, {**self.finishing(), **values})

    def clear_finishing(self) -> None:
        """Remove ``FINISHING.json``: the run is COMPLETE and it has served its purpose."""
        self.checkpoints.remove(FINISHING)
