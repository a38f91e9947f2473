"""Whether a run folder holds a training to continue, and in which MLflow run.

A rerun with the same ``runtime.run_dir`` continues the interrupted training when
``runtime.resume`` is on, the folder is not COMPLETE, and its newest readable checkpoint was
written with the same settings (:func:`config_fingerprint`). It then continues the MLflow run
recorded in ``run.json``, if the tracking store still has it.
"""

from __future__ import annotations

import hashlib
import json
import logging

from keras_dl import tracking
from keras_dl.checkpoints import Checkpoints
from keras_dl.config import free_on_resume_keys, to_flat_dict
from keras_dl.run.folder import RUN_FILE, RunFolder

log = logging.getLogger(__name__)


def resume_run_id(exp, folder: RunFolder) -> str | None:
    """The MLflow run to continue, or None for a fresh one (see the module's docstring)."""
    if not exp.runtime.resume or not _resumable(folder, exp):
        return None
    run_id = folder.recorded_run_id()
    if run_id is None:
        return None
    record = folder.store.path(RUN_FILE)
    try:
        tracking.client(exp.tracking.uri).get_run(run_id)
    except Exception:
        log.warning(
            "Run %s recorded in %s is not in the tracking store %s: resuming the checkpoint "
            "in a new MLflow run.",
            run_id,
            record,
            exp.tracking.uri,
        )
        return None
    print(f"Resuming MLflow run {run_id} (from {record}).")
    return run_id


def config_fingerprint(exp) -> str:
    """A hash of the settings a resumed training must share with the interrupted one.

    Left out, so they may change on resume: the number of epochs (to train longer), verbosity,
    the runtime, tracking, callbacks and registry sections (a rerun with other registry
    settings decides again on the model already trained), and how the data is read (workers,
    cache, I/O concurrency).
    """
    flat = to_flat_dict(exp)
    free = ("runtime.", "tracking.", "callbacks.", "registry.")
    free_keys = free_on_resume_keys(exp.sections())  # declared on the fields (setting)
    kept = {k: str(v) for k, v in flat.items() if not k.startswith(free) and k not in free_keys}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def _resumable(folder: RunFolder, exp) -> bool:
    """True when the training is unfinished and its newest readable checkpoint was written
    with this configuration."""
    ckpts = Checkpoints(folder.checkpoints)
    if ckpts.is_complete():
        return False
    header = ckpts.newest_header()
    if header is None:
        return False
    return header.get("config", config_fingerprint(exp)) == config_fingerprint(exp)
