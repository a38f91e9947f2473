"""The default callbacks of a run, built from the :class:`~keras_dl.run.Run` they serve, and
the restore that positions the data before ``fit`` (like Lightning's callbacks read the Trainer,
these read the run: its config, world, MLflow run and folder)."""

from __future__ import annotations

from keras_dl.callbacks.checkpoint import Checkpoint, broadcast_position
from keras_dl.callbacks.early_stopping import EarlyStopping
from keras_dl.callbacks.mlflow_logger import MLflowLogger
from keras_dl.callbacks.plots import Plots
from keras_dl.callbacks.preemption import Preemption
from keras_dl.callbacks.progress_bar import ProgressBar
from keras_dl.callbacks.system_metrics import SystemMetrics
from keras_dl.callbacks.tensorboard import RunTensorBoard
from keras_dl.callbacks.throughput import Throughput
from keras_dl.distribute.world import current_world
from keras_dl.run.resume import config_fingerprint


def make_callbacks(run, data) -> list:
    """The default callbacks for ``exp``, in the order they must run.

    Checkpoint first (it may end a resumed epoch early and must clear that before others look),
    then EarlyStopping, Throughput (it adds its figures to the logs the loggers read),
    SystemMetrics (each rank's CPU, memory, I/O and GPU, queued through the logger),
    MLflowLogger, Plots, TensorBoard (rank 0 only), the progress bar, and Preemption last
    (SIGTERM/SIGINT: checkpoint at the end of the step and stop). Every rank gets the same
    list but for TensorBoard and the progress bar: each callback gates its own side effects
    on rank 0.

    Args:
        run: The :class:`~keras_dl.run.Run` (its experiment's ``callbacks``, ``runtime`` and
            ``train`` sections, its world, its MLflow run id on rank 0, its folder).
        data: The :class:`~keras_dl.data.splits.DataSplits` being trained on.

    Returns:
        The callbacks, ready for ``model.fit``.
    """
    exp, world, run_id = run.exp, run.world, run.run_id
    c = exp.callbacks
    monitor = c.monitor
    if data.validation is None and monitor.startswith("val_"):
        monitor = monitor[len("val_") :]  # no validation split: watch the training metric
    checks = data.validation or data.test
    checkpoint = Checkpoint(
        run.folder.checkpoints.uri,
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
    ]
    logger = MLflowLogger(run_id=run_id, end_run=False, log_every_n_steps=c.log_every_n_steps)
    if exp.tracking.system_metrics_seconds > 0:
        # Before the logger: its last samples are queued before the logger's final flush.
        callbacks.append(SystemMetrics(logger, exp.tracking.system_metrics_seconds))
    callbacks.append(logger)
    if c.plots:
        confusion = (checks.dataset, checks.steps) if checks is not None else None
        callbacks.append(Plots(run_id=run_id, confusion_data=confusion))
    if world.is_chief and (exp.tracking.tensorboard or exp.runtime.profile_steps):
        # Rank 0 only: one writer per run (several ranks would interleave their events).
        callbacks.append(RunTensorBoard(run_id=run_id, profile_steps=exp.runtime.profile_steps))
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
