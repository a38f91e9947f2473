"""Which checkpoint of a folder a training resumes from, loaded into its model.

:func:`resume_newest` is the resume half of :class:`keras_dl.callbacks.Checkpoint`, on rank 0:
a finished training's folder is cleared (a new training starts), a writer's leftovers are
removed, and the newest checkpoint that counts, loads, and was written with the same
configuration is loaded; with none, the old files are set aside so they never mix with the new
training's.
"""

from __future__ import annotations

import logging

from keras_dl.checkpoints.protocol import PREVIOUS, Checkpoints

log = logging.getLogger(__name__)


def resume_newest(ckpts: Checkpoints, model, resume: bool, metadata: dict) -> dict | None:
    """Load the newest resumable checkpoint of ``ckpts`` into ``model``: its header, or None.

    Args:
        ckpts: The folder's checkpoints.
        model: The compiled model its variables are loaded into.
        resume: False: delete the folder's checkpoints and start fresh.
        metadata: The headers' extra values; a ``"config"`` value is a fingerprint, and
            checkpoints written with another are not resumed.
    """
    where = ckpts.store.uri
    if not resume or ckpts.is_complete():
        if resume:
            print(f"The training in {where} finished; starting a new one.")
        ckpts.clear()
        return None
    ckpts.remove_temporaries()  # left by a writer killed mid-write
    adopted = ckpts.adopt_legacy()
    if adopted:
        print(f"Wrote the manifests of {len(adopted)} checkpoint(s) made before manifests.")
    ckpts.prune()  # files without a manifest, older than the newest that counts
    for name, why in ckpts.uncounted().items():
        log.warning("Skipping unreadable checkpoint %s (%s).", name, why)
    wanted = metadata.get("config")
    for name in reversed(ckpts.list()):
        try:
            if wanted is not None and ckpts.read_header(name).get("config", wanted) != wanted:
                print(
                    f"The checkpoints in {where} were written with another configuration; "
                    "starting a new training."
                )
                break
            header = ckpts.load(name, model)
        except Exception as exc:  # a corrupt file or another model's: fall back
            log.warning("Skipping unreadable checkpoint %s (%s).", name, exc)
            continue
        print(
            f"Resuming from checkpoint {name}: {header['epoch']} epoch(s) and "
            f"{header['step']} step(s) done (global step {header['global_step']})."
        )
        return header
    moved = ckpts.set_aside()  # nothing resumable: old files must not mix with the new ones
    if moved:
        print(
            f"Moved {moved} checkpoint(s) that cannot be resumed to {ckpts.store.child(PREVIOUS).uri}."
        )
    return None
