"""The default callbacks of ``keras_dl.train.fit``, and the resume bookkeeping around them.

``fit`` calls, in order: :func:`resume_run_id` (which MLflow run to continue), then, once the
run exists, :func:`record_run_id`; after ``compile``, :func:`make_callbacks` and
:func:`prepare_fit` (restore the last checkpoint, position the data, instrument the input).

The run directory (``runtime.run_dir``, a local path or an object-store URI) holds
``config.yaml``, ``run.json`` (the MLflow run id) and ``checkpoints/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from keras_dl import config, storage
from keras_dl.callbacks import remote_checkpoints as remote
from keras_dl.callbacks.checkpoint import (
    Checkpoint,
    broadcast_position,
    is_complete,
    list_checkpoints,
    read_header,
)
from keras_dl.callbacks.early_stopping import EarlyStopping
from keras_dl.callbacks.mlflow_logger import MLflowLogger
from keras_dl.callbacks.plots import Plots
from keras_dl.callbacks.preemption import Preemption
from keras_dl.callbacks.progress_bar import ProgressBar
from keras_dl.callbacks.throughput import Throughput
from keras_dl.config import to_flat_dict
from keras_dl.distribute.world import current_world

log = logging.getLogger(__name__)

RUN_FILE = "run.json"


def make_callbacks(exp, world, run_id: str | None, data) -> list:
    """The default callbacks for ``exp``, in the order they must run.

    Checkpoint first (it may end a resumed epoch early and must clear that before others look),
    then EarlyStopping, Throughput (it adds its figures to the logs the loggers read),
    MLflowLogger, Plots, the progress bar, and Preemption last (SIGTERM/SIGINT: checkpoint at
    the end of the step and stop). Every rank gets the same list: each
    callback gates its own side effects on rank 0.

    Args:
        exp: The resolved experiment (``callbacks``, ``runtime``, ``train`` sections).
        world: This process's :class:`~keras_dl.distribute.world.World`.
        run_id: The MLflow run (rank 0), or None.
        data: The :class:`~keras_dl.data.splits.DataSplits` being trained on.

    Returns:
        The callbacks, ready for ``model.fit``.
    """
    c = exp.callbacks
    monitor = c.monitor
    if data.validation is None and monitor.startswith("val_"):
        monitor = monitor[len("val_") :]  # no validation split: watch the training metric
    checks = data.validation or data.test
    checkpoint = Checkpoint(
        checkpoint_dir(exp),
        every_n_steps=c.checkpoint_every_n_steps,
        keep=c.keep_checkpoints,
        resume=exp.runtime.resume,
        metadata={"run_id": run_id, "config": config_fingerprint(exp)},
        mark_complete=False,  # keras_dl.finish marks it after evaluation and logging
    )
    callbacks = [
        checkpoint,
        EarlyStopping(
            monitor=monitor,
            mode=c.mode,
            min_delta=c.min_delta,
            patience=c.patience,
            stopping_threshold=c.stopping_threshold,
            divergence_threshold=c.divergence_threshold,
            check_finite=c.check_finite,
            divergence_factor=c.divergence_factor,
            restore_best_weights=c.restore_best_weights,
            run_id=run_id,
        ),
        Throughput(batch_size=exp.train.batch_size, log_every_n_steps=c.log_every_n_steps),
        MLflowLogger(run_id=run_id, end_run=False, log_every_n_steps=c.log_every_n_steps),
    ]
    if c.plots:
        confusion = (checks.dataset, checks.steps) if checks is not None else None
        callbacks.append(Plots(run_id=run_id, confusion_data=confusion))
    if world.is_chief and exp.train.verbose:
        callbacks.append(ProgressBar(batch_size=exp.train.batch_size))
    # Last among the batch-end hooks, so the step it stops after is logged like any other.
    callbacks.append(Preemption(checkpoint))
    return callbacks


def prepare_fit(callbacks: list, model, data) -> int:
    """Restore the last checkpoint into ``model`` and position the training data after it.

    Call after ``compile`` and before ``fit``, on every rank (under Horovod it is collective).
    Rank 0 reads the checkpoint and its step is broadcast here, so every rank skips the batches
    it consumed; the ``BroadcastState`` callback copies the restored state to the other ranks
    when ``fit`` starts. Also wraps the training data so
    :class:`Throughput` can measure the time steps wait for input (single-replica only: a
    mirrored strategy distributes the dataset itself).

    Returns:
        The global step training resumes from (0 for a fresh start).
    """
    step, restored = 0, None
    for cb in callbacks:
        if isinstance(cb, Checkpoint):
            cb.set_model(model)
            step, restored = cb.restore(), cb.restored
            if current_world().size > 1 and cb.resume:
                # Only rank 0 reads the checkpoint: every rank must skip the batches it
                # consumed before the interruption, or the ranks' data would drift apart.
                step, _ = broadcast_position(step, 0)
        if isinstance(cb, MLflowLogger) and restored:
            cb.backfill = restored.get("last_epoch")
        if isinstance(cb, Throughput) and model.distribute_strategy.num_replicas_in_sync == 1:
            data.train.dataset = cb.instrument(data.train.dataset)
    if step:
        # The data position: the resumed epoch is read again (same seed, same order) and the
        # batches the checkpointed steps consumed are dropped before they reach tf.data.
        data.train.start_at(step)
    return step


def resume_run_id(exp) -> str | None:
    """The MLflow run to continue: the one recorded in ``runtime.run_dir`` when there is an
    unfinished training with a checkpoint to resume, and ``runtime.resume`` is on."""
    record = storage.join(exp.runtime.run_dir, RUN_FILE)
    ckpts = checkpoint_dir(exp)
    if not exp.runtime.resume or is_complete(ckpts) or not _resumable(ckpts, exp):
        return None
    try:
        run_id = json.loads(storage.read_file(record))["run_id"]
    except (OSError, ValueError, KeyError):
        return None
    import mlflow

    try:
        mlflow.MlflowClient(exp.tracking.uri).get_run(run_id)
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


def record_run_id(exp, run_id: str) -> None:
    """Write ``run.json`` (the MLflow run id and tracking URI) into ``runtime.run_dir``."""
    if remote.is_remote(exp.runtime.run_dir):
        data = json.dumps({"run_id": run_id, "tracking_uri": exp.tracking.uri}).encode()
        storage.write_atomic(storage.join(exp.runtime.run_dir, RUN_FILE), data)
        return
    path = Path(exp.runtime.run_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RUN_FILE}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"run_id": run_id, "tracking_uri": exp.tracking.uri}))
    os.replace(tmp, path)


def record_config(exp) -> None:
    """Write the resolved config as ``config.yaml`` into ``runtime.run_dir``."""
    if remote.is_remote(exp.runtime.run_dir):
        text = config.dumps(exp)
        storage.write_atomic(storage.join(exp.runtime.run_dir, "config.yaml"), text.encode())
    else:
        config.save(exp, Path(exp.runtime.run_dir) / "config.yaml")


def config_fingerprint(exp) -> str:
    """A hash of the settings a resumed training must share with the interrupted one.

    Left out, so they may change on resume: the number of epochs (to train longer), verbosity,
    the runtime, tracking, callbacks and registry sections (a rerun with other registry
    settings decides again on the model already trained), and how the data is read (workers,
    cache).
    """
    flat = to_flat_dict(exp)
    free = ("runtime.", "tracking.", "callbacks.", "registry.")
    free_keys = {"train.epochs", "train.verbose", "data.workers", "data.cache_dir"}
    kept = {k: str(v) for k, v in flat.items() if not k.startswith(free) and k not in free_keys}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def _resumable(ckpts: Path | str, exp) -> bool:
    """True when the newest readable checkpoint was written with this configuration."""
    for path in reversed(list_checkpoints(ckpts)):
        try:
            header = read_header(path)
        except Exception:
            continue
        return header.get("config", config_fingerprint(exp)) == config_fingerprint(exp)
    return False


def checkpoint_dir(exp) -> Path | str:
    """``runtime.run_dir``/checkpoints (a Path, or a URI for an object-store run_dir)."""
    if remote.is_remote(exp.runtime.run_dir):
        return storage.join(exp.runtime.run_dir.rstrip("/"), "checkpoints")
    return Path(exp.runtime.run_dir) / "checkpoints"
