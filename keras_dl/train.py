"""The one training path: ``fit(experiment)``.

Data flows one way: table snapshot -> Petastorm reader -> tf.data -> ``model.fit`` under the
chosen strategy -> MLflow (chief only). Every step that writes is gated on the chief, and the
MLflow run always ends: FINISHED on success, FAILED on any error or interrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from keras_dl.config import Experiment
from keras_dl.data.splits import DataSplits, make_splits
from keras_dl.distribute.strategy import make_strategy
from keras_dl.distribute.world import current_world
from keras_dl.divergence import check_finite
from keras_dl.errors import ConfigError, Preempted
from keras_dl.recipe import Recipe, check_model, configure, load_recipe
from keras_dl.report.build import log_run_report
from keras_dl.run import Run, open_run

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced (on non-chief ranks only ``metrics`` is filled).

    ``not_registered`` is why the model was not registered when :mod:`keras_dl.model.gate` refused
    it (the run still ended FINISHED); None when it was registered or registration was off.
    """

    run_id: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    model_uri: str | None = None
    registered_version: int | None = None
    not_registered: str | None = None
    history: dict[str, list[float]] = field(default_factory=dict)
    model: Any = None  # takes the table's columns by name, as the logged model does


def fit(
    exp: Experiment,
    recipe: Recipe | None = None,
    callbacks: Sequence = (),
    run_id: str | None = None,
    lock_run_dir: bool | None = None,
) -> TrainResult:
    """Train ``exp``'s recipe on its table and track everything in MLflow.

    With ``runtime.strategy=horovod`` every rank calls this (under ``horovodrun`` or
    :class:`~keras_dl.launch.HorovodRunner`); it joins the Horovod world first.

    Args:
        exp: A resolved experiment (see :func:`keras_dl.config.resolve`).
        recipe: The recipe; defaults to ``load_recipe(exp.recipe)``.
        callbacks: Extra Keras callbacks. Defaults to ().
        run_id: An MLflow run to attach to (the launcher creates it, so that it can end it
            FAILED if rank 0 dies). Defaults to None (a new run).
        lock_run_dir: Take ``runtime.run_dir``'s lock on the chief for the whole run (see
            :mod:`keras_dl.runlock`). Defaults to None: yes, unless this is a rank whose
            launcher holds it (:func:`~keras_dl.launch.launch` does).

    Returns:
        The run id, test metrics, model URI and registered version, or why the model was not
        registered (``not_registered``; the CLI then exits 4).

    Raises:
        RunLockedError: Another training holds ``runtime.run_dir``.
        DivergenceError: A loss, metric or weight became NaN or infinite, or the training loss
            grew past ``callbacks.divergence_factor`` times the first epoch's.
    """

    if exp.runtime.strategy == "horovod":
        from keras_dl.distribute.horovod import init

        init()  # every rank joins the Horovod world before it shards data by rank
    recipe = recipe or load_recipe(exp.recipe)
    exp = configure(exp, recipe)  # e.g. the tabular recipe's batch size from the row count
    if recipe.prepare is not None:
        recipe = recipe.prepare(exp)  # table-dependent parts, e.g. a string label's classes
    check_model(exp, recipe)  # e.g. model.num_classes against the labels: before any run starts
    world = current_world()
    if exp.train.batch_size % world.size:
        raise ConfigError(
            f"train.batch_size={exp.train.batch_size} is the global batch and must divide evenly "
            f"over {world.size} processes. Use a multiple of {world.size}."
        )
    run = open_run(exp, world, run_id, lock_run_dir)
    try:
        with run:
            result = _run(run, recipe, callbacks)
    except Preempted:  # KILLED, to be resumed: the resumed run writes the report
        raise
    except BaseException:  # FAILED (diverged, bad data, ...): the report shows how far it got
        log_run_report(run)
        raise
    log_run_report(run)  # FINISHED, the model registered or refused by the gate
    return result


def _run(run: Run, recipe, callbacks) -> TrainResult:
    """Read the data, start (or continue) the MLflow run, and train. The run ends as the
    ``with open_run`` block around this exits: FINISHED, or FAILED / KILLED with the cause."""
    import keras

    exp, world = run.exp, run.world
    keras.utils.set_random_seed(exp.train.seed)
    if exp.train.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    strategy = make_strategy(exp.runtime.strategy)
    data = make_splits(
        exp.data,
        exp.train.batch_size // world.size,
        rank=world.rank,
        world_size=world.size,
        accept=recipe.accept,
        preprocess=recipe.preprocess,
        preprocess_train=recipe.preprocess_train,
        class_weight=exp.train.class_weight,
    )
    if run.start(tags=data.snapshot.lineage):  # on the chief; a no-op on other ranks
        _log_datasets(run, data)
    with data.original_errors():  # the reader's own error, not TF's wrapper of it
        return _fit(run, recipe, data, strategy, list(callbacks))


def _log_datasets(run: Run, data: DataSplits) -> None:
    """The run's inputs: each split's table, version, columns and rows (MLflow's Datasets)."""
    import mlflow

    from keras_dl.run.datasets import log_datasets, range_params

    splits = (("train", data.train), ("validation", data.validation), ("test", data.test))
    client = mlflow.MlflowClient(run.exp.tracking.uri)
    log_datasets(client, run.run_id, splits, data.plan.columns)
    for key, value in range_params(data.train.snapshot).items():  # data.since_version runs
        client.log_param(run.run_id, key, value)


def _fit(run: Run, recipe, data: DataSplits, strategy, callbacks) -> TrainResult:
    import keras
    import mlflow

    from keras_dl.callbacks.checkpoint import Checkpoint
    from keras_dl.callbacks.early_stopping import EarlyStopping
    from keras_dl.callbacks.mlflow_logger import MLflowLogger
    from keras_dl.callbacks.system_metrics import SystemMetrics
    from keras_dl.distribute.lr import scale_learning_rate
    from keras_dl.model.log import serving_model
    from keras_dl.model.warm_start import init_from_tags, warm_start
    from keras_dl.run import make_callbacks, prepare_fit
    from keras_dl.run.compile_options import compile_weighted
    from keras_dl.run.finish import finish
    from keras_dl.trivial import run_trivial_loss, trivial_params

    exp, world, run_id = run.exp, run.world, run.run_id

    with strategy.scope():
        model = recipe.build_model(data, exp)
        options = {"loss": recipe.loss, "metrics": list(recipe.metrics)}
        if recipe.compile_options is not None:
            options.update(recipe.compile_options(data, exp))
        lr = exp.train.learning_rate
        if exp.train.lr_schedule == "cosine":
            lr = keras.optimizers.schedules.CosineDecay(lr, exp.train.epochs * data.train.steps)
        lr = scale_learning_rate(
            lr,
            exp.runtime.lr_scaling,
            replicas=world.size * strategy.num_replicas_in_sync,
            warmup_steps=round(exp.runtime.warmup_epochs * data.train.steps),
        )
        # A recipe may bring its own optimizer instance (the Spark ML KerasEstimator's).
        optimizer = options.pop("optimizer", None) or make_optimizer(exp.train.optimizer, lr)
        if exp.runtime.strategy == "horovod":
            optimizer, more = _horovod_optimizer(optimizer, exp)
            options.update(more)
        # Padding rows (equal steps on every rank) weigh 0 and data.weight_column /
        # train.class_weight weigh rows: weighted metrics count those weights, and the losses
        # leave weight-0 rows out of the batch's mean (a padded batch trains as its real rows).
        compile_weighted(model, {"optimizer": optimizer, **options}, data.train.weighted)
        if exp.init_from and world.is_chief:
            # Before the resume below, which overwrites these weights with a checkpoint's;
            # under Horovod, BroadcastState copies rank 0's weights to the other ranks.
            mlflow.set_tags(init_from_tags(warm_start(model, exp.init_from, exp.tracking.uri)))
    callbacks = [*make_callbacks(run, data), *callbacks]
    trivial = run_trivial_loss(exp.callbacks.trivial_loss_factor, model, data)
    for cb in callbacks:  # built before the model, and its loss, existed
        if isinstance(cb, EarlyStopping):
            cb.trivial_loss, cb.trivial_loss_factor = trivial, exp.callbacks.trivial_loss_factor
    # Resume: rank 0 restores the last checkpoint, every rank positions its data after it.
    resume = prepare_fit(callbacks, model, data)
    checkpoint = next(c for c in callbacks if isinstance(c, Checkpoint))
    if world.is_chief:
        replicas = strategy.num_replicas_in_sync
        _log_data_params(run, data, resume, checkpoint.restored, replicas)
        if trivial is not None:  # the same on a resume: the same labels, the same loss
            mlflow.log_params(trivial_params(trivial))
    if exp.runtime.strategy == "horovod":
        from keras_dl.callbacks.horovod import BroadcastState, MetricAverage
        from keras_dl.callbacks.stall import StallWatchdog

        # The watchdog first, so it times every collective below; averaged metrics next, so
        # MLflow, early stopping and checkpoints agree on every rank; the broadcast last, so it
        # sends what a resuming callback restored on rank 0.
        callbacks = [
            StallWatchdog(exp.runtime.stall_timeout),
            MetricAverage(),
            *callbacks,
            BroadcastState(),
        ]
    try:
        history = _run_fit(model, data, exp, world, callbacks)
    except BaseException:
        for cb in callbacks:
            if isinstance(cb, SystemMetrics):
                cb.close()  # Keras skips on_train_end when fit raises: stop its thread here
            if isinstance(cb, MLflowLogger):
                cb.flush()  # the steps and epochs before the error still reach the run
        raise
    # Every rank checks the same (averaged, broadcast) values, so every rank stops together.
    check_finite(
        model,
        history.history,
        learning_rate=exp.train.learning_rate,
        factor=exp.callbacks.divergence_factor,
        trivial=trivial,
        trivial_factor=exp.callbacks.trivial_loss_factor,
    )
    metrics, model_uri, version, refused = finish(run, model, data, checkpoint)
    return TrainResult(
        run_id=run_id,
        metrics=metrics,
        model_uri=model_uri,
        registered_version=version,
        not_registered=refused,
        history=dict(history.history),
        # The table's columns by name, as logged: packed features are packed inside it.
        model=serving_model(model, data.plan),
    )


def _log_data_params(run: Run, data: DataSplits, resume, header: dict | None, replicas: int):
    """What the data is, as params; what depends on the number of ranks, per attempt.

    The rows, files and row groups are the table's and never change on a resume. The steps per
    epoch and the padding depend on the ranks: they are params of the first attempt and, for
    every attempt, metrics at the global step it started from (a resume on other ranks would
    otherwise change a param, which MLflow refuses). A resume on other ranks prints one line and
    tags the run with it.
    """
    import mlflow

    from keras_dl.run.position import RESUME_TAG, resume_note

    exp, world, stats = run.exp, run.world, data.train.stats
    params = {
        "data.train_rows": stats.rows,
        "data.files": stats.files,
        **({"data.row_groups": stats.row_groups} if stats.row_groups is not None else {}),
        # Every live row trains once per epoch, across all ranks.
        "data.rows_trained_per_epoch": stats.rows,
        **_skipping_params(data),
    }
    per_ranks = {
        "train.steps_per_epoch": data.train.steps,
        # The padding on this rank (zero weights, for equal steps) fills its last batch.
        "data.padded_rows_per_epoch": data.train.padded_rows,
        "runtime.world_size": world.size,
    }
    logged = mlflow.MlflowClient(exp.tracking.uri).get_run(run.run_id).data.params
    fresh = {k: v for k, v in {**params, **per_ranks}.items() if k not in logged}
    if fresh:
        mlflow.log_params(fresh)
    step = int((header or {}).get("global_step", 0))
    mlflow.log_metrics({k: float(v) for k, v in per_ranks.items()}, step=step)
    if resume is None or header is None:
        return
    scaled = world.size * replicas
    note = resume_note(resume, header, stats.rows, exp.runtime.lr_scaling, scaled)
    if note:
        print(note)
        mlflow.set_tag(RESUME_TAG, note)


def _run_fit(model, data: DataSplits, exp: Experiment, world, callbacks):
    """``model.fit`` over the training split, validating on the validation split each epoch."""
    val = data.validation
    return model.fit(
        data.train.dataset,
        epochs=exp.train.epochs,
        steps_per_epoch=data.train.steps,
        # Repeated: Keras keeps one validation iterator across epochs when validation_steps is
        # set, and under MirroredStrategy an exhausted one raises StopIteration in epoch 2.
        # val.steps is exactly one pass, so every epoch still validates on every row once.
        validation_data=val.dataset.repeat() if val else None,
        validation_steps=val.steps if val else None,
        callbacks=callbacks,
        verbose=exp.train.verbose if world.is_chief else 0,
        shuffle=False,  # the tf.data pipeline shuffles (row groups + buffer)
    )


def _horovod_optimizer(optimizer, exp: Experiment):
    """The optimizer that averages gradients over ranks, and the compile options it needs."""
    import keras

    from keras_dl.distribute.horovod import distributed_optimizer

    if exp.train.mixed_precision:
        # Wrap the loss-scaled optimizer, so its overflow check sees the averaged gradients
        # and every rank skips the same steps.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer = distributed_optimizer(optimizer, fp16_allreduce=exp.runtime.fp16_allreduce)
    return optimizer, {"jit_compile": False}  # Horovod's ops have no XLA kernels here


def make_optimizer(name: str, learning_rate):
    """A Keras optimizer by name ("adam", "sgd", "rmsprop", "adamw", ...)."""
    import keras

    try:
        return keras.optimizers.get(
            {"class_name": name, "config": {"learning_rate": learning_rate}}
        )
    except ValueError:
        raise ConfigError(
            f"train.optimizer={name!r} is not a Keras optimizer. Use adam, adamw, sgd, rmsprop, "
            "nadam, adagrad or another keras.optimizers class name."
        ) from None


def _skipping_params(data) -> dict:
    """Per split read through row filters: the rows whose row groups a filter was applied to
    beside the rows kept, and the files and row groups their statistics skipped unread."""
    out = {}
    for name in ("train", "validation", "test"):
        split = getattr(data, name, None)
        if split is None or split.stats.rows_scanned is None:
            continue  # no row filter: every live row is kept, nothing is scanned for one
        out.update(
            {
                f"data.{name}.rows_scanned": split.stats.rows_scanned,
                f"data.{name}.rows_kept": split.stats.rows,
                f"data.{name}.files_skipped": split.snapshot.skipped_files,
                f"data.{name}.row_groups_skipped": split.stats.row_groups_skipped,
            }
        )
    return out
