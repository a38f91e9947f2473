"""The default callbacks of a run, built from the :class:`~keras_dl.run.Run` they serve, and
the restore that positions the data before ``fit`` (like Lightning's callbacks read the Trainer,
these read the run: its config, world, MLflow run and folder)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from keras_dl.callbacks.checkpoint import Checkpoint, SaveAtEpochEnd
from keras_dl.callbacks.early_stopping import EarlyStopping
from keras_dl.callbacks.mlflow_logger import MLflowLogger
from keras_dl.callbacks.plots import Plots
from keras_dl.callbacks.preemption import Preemption
from keras_dl.callbacks.progress_bar import ProgressBar
from keras_dl.callbacks.prometheus import PrometheusMetrics
from keras_dl.callbacks.prometheus_feed import FEED_ENV
from keras_dl.callbacks.rows_trained import RowsTrained
from keras_dl.callbacks.system_metrics import SystemMetrics
from keras_dl.callbacks.tensorboard import RunTensorBoard
from keras_dl.callbacks.throughput import Throughput
from keras_dl.data.stream.epoch_position import EpochPosition, Resume
from keras_dl.distribute.broadcast import broadcast_record
from keras_dl.distribute.world import current_world
from keras_dl.run.position import data_position
from keras_dl.run.resume import config_fingerprint


@dataclass
class RunCallbacks:
    """A run's own callbacks, held by name: nothing finds them by type. Iterating gives them in
    the order ``fit`` runs them (see :func:`make_callbacks`)."""

    checkpoint: Checkpoint
    rows_trained: RowsTrained
    early_stopping: EarlyStopping
    throughput: Throughput
    logger: MLflowLogger
    system_metrics: SystemMetrics | None = None
    # Prometheus, plots, TensorBoard, the progress bar, and Preemption last
    after_logger: tuple = ()
    prometheus: PrometheusMetrics | None = None  # also in after_logger
    save_epoch: SaveAtEpochEnd | None = None  # the checkpoint's epoch-end save, before the logger

    def ordered(self, extra: Sequence = ()) -> list:
        """The callbacks for ``model.fit``, with ``extra`` (the caller's own) after them."""
        system = [self.system_metrics] if self.system_metrics is not None else []
        first = [self.checkpoint, self.rows_trained, self.early_stopping, self.throughput]
        # The epoch's checkpoint once its logs are whole, before MLflow gets them: an epoch
        # whose checkpoint cannot be written (a full disk) is not logged, and its rerun logs
        # it once (SaveAtEpochEnd).
        save = [self.save_epoch] if self.save_epoch is not None else []
        return [*first, *system, *save, self.logger, *self.after_logger, *extra]

    def __iter__(self) -> Iterator:
        return iter(self.ordered())

    def after_failure(self) -> None:
        """Keras skips ``on_train_end`` when ``fit`` raises: stop the sampler's thread, and send
        the steps and epochs logged before the error to the run (one last attempt, not the
        logger's flush_timeout, when its tracking server is not answering)."""
        if self.system_metrics is not None:
            self.system_metrics.close()
        self.logger.flush(stopped=True)
        if self.prometheus is not None:
            self.prometheus.close()  # the end state: pushed, and scraped once more


def make_callbacks(run, data) -> RunCallbacks:
    """The default callbacks for ``exp``, in the order they must run.

    Checkpoint first (it may end a resumed epoch early and must clear that before others look),
    then RowsTrained, EarlyStopping, Throughput (they add to the logs the loggers read),
    SystemMetrics (each rank's CPU, memory, I/O and GPU, queued through the logger), the
    checkpoint's epoch-end save (:class:`SaveAtEpochEnd`: its header holds the whole epoch's
    logs, backfilled by a resumed run if a kill came before MLflow got them; an epoch whose
    checkpoint cannot be written is never logged, so its rerun logs it once), MLflowLogger,
    PrometheusMetrics (with ``tracking.prometheus_port`` or
    ``tracking.prometheus_pushgateway``), Plots, TensorBoard (rank 0 only), the progress bar,
    and Preemption last
    (SIGTERM/SIGINT: checkpoint at the end of the step and stop). Every rank gets the same
    list but for TensorBoard and the progress bar: each callback gates its own side effects
    on rank 0.

    Args:
        run: The :class:`~keras_dl.run.Run` (its experiment's ``callbacks``, ``runtime`` and
            ``train`` sections, its world, its MLflow run id on rank 0, its folder).
        data: The :class:`~keras_dl.data.splits.DataSplits` being trained on.

    Returns:
        The run's callbacks by name; ``.ordered()`` is the list for ``model.fit``.
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
        mark_complete=False,  # keras_dl.run.finish marks it after evaluation and logging
    )
    logger = MLflowLogger(run_id=run_id, end_run=False, log_every_n_steps=c.log_every_n_steps)
    # Before the logger: its last samples are queued before the logger's final flush.
    seconds = exp.tracking.system_metrics_seconds
    after_logger = []
    t = exp.tracking
    prometheus = None
    throughput = Throughput(batch_size=exp.train.batch_size, log_every_n_steps=c.log_every_n_steps)
    # Last among the batch-end hooks, so the step it stops after is logged like any other.
    preemption = Preemption(checkpoint)
    if t.prometheus_port is not None or t.prometheus_pushgateway:
        # Under a launcher that serves the port itself, rank 0 sends it the figures instead.
        feed = os.environ.get(FEED_ENV, "")
        prometheus = PrometheusMetrics(
            run_id=run_id,
            recipe=exp.recipe,
            port=None if feed else t.prometheus_port,
            feed=feed,
            bind=t.prometheus_bind,
            pushgateway=t.prometheus_pushgateway,
            final_scrape_seconds=t.prometheus_final_scrape_seconds,
            throughput=throughput,
            preemption=preemption,
            restarts=restart_count(t.uri, run_id) if run_id is not None else 0,
        )
        after_logger.append(prometheus)
    if c.plots:
        confusion = (checks.dataset, checks.steps) if checks is not None else None
        after_logger.append(Plots(run_id=run_id, confusion_data=confusion))
    if world.is_chief and (exp.tracking.tensorboard or exp.runtime.profile_steps):
        # Rank 0 only: one writer per run (several ranks would interleave their events).
        after_logger.append(RunTensorBoard(run_id=run_id, profile_steps=exp.runtime.profile_steps))
    if world.is_chief and exp.train.verbose:
        after_logger.append(ProgressBar(batch_size=exp.train.batch_size))
    after_logger.append(preemption)
    return RunCallbacks(
        checkpoint=checkpoint,
        rows_trained=RowsTrained(data.train),
        early_stopping=EarlyStopping(
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
        throughput=throughput,
        logger=logger,
        system_metrics=(
            SystemMetrics(logger, seconds, also=prometheus and prometheus.record_system)
            if seconds > 0
            else None
        ),
        after_logger=tuple(after_logger),
        prometheus=prometheus,
        save_epoch=SaveAtEpochEnd(checkpoint),
    )


def restart_count(tracking_uri: str, run_id: str) -> int:
    """The launcher's automatic restarts of this run so far (its ``keras_dl.restarts``
    metric, logged before each restart by :mod:`keras_dl.launch.job`)."""
    import mlflow

    history = mlflow.MlflowClient(tracking_uri).get_metric_history(run_id, "keras_dl.restarts")
    return int(max((m.value for m in history), default=0))


def prepare_fit(callbacks: RunCallbacks, model, data) -> Resume | None:
    """Restore the last checkpoint into ``model`` and position the training data after it.

    Call after ``compile`` and before ``fit``, on every rank (under Horovod it is collective).
    Rank 0 reads the checkpoint and its data position is broadcast here, so every rank reads
    the rest of the interrupted epoch: on the same ranks and batch, the batches after the ones
    consumed; on others, the rows not yet trained, planned anew (:mod:`keras_dl.data.stream.epoch_position`).
    The ``BroadcastState`` callback copies the restored state to the other ranks when ``fit``
    starts. Also wraps the training data so :class:`Throughput` can measure the time steps wait
    for input (single-replica only: a mirrored strategy distributes the dataset itself).

    Returns:
        Where the data resumes, or None for a fresh start.

    Raises:
        ConfigError: The checkpoint cannot be resumed exactly on these ranks (its text says
            which settings to change).
    """
    world = current_world()
    resume = None
    checkpoint = callbacks.checkpoint
    checkpoint.set_model(model)
    checkpoint.restore()
    restored = checkpoint.restored
    position = data_position(restored, checkpoint.directory) if restored else None
    if world.size > 1 and checkpoint.resume:
        # Only rank 0 reads the checkpoint: every rank must resume at its position.
        ints = broadcast_record(position.to_ints() if position else [], prefix="position")
        position = EpochPosition.from_ints(ints) if ints else None
    if position is not None and (position.epoch or position.segments):
        resume = data.train.resume_from(position)
        checkpoint.attach_data(data.train, resume.epoch, resume.steps)
    else:
        checkpoint.attach_data(data.train)
    if restored:
        callbacks.logger.backfill = restored.get("last_epoch")
    if resume is not None:
        callbacks.rows_trained.before = {resume.epoch: resume.trained_before}
    if model.distribute_strategy.num_replicas_in_sync == 1:
        data.train.dataset = callbacks.throughput.instrument(data.train.dataset)
    return resume
