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

from keras_dl import tracking
from keras_dl.callbacks.preemption import Preempted
from keras_dl.config import Experiment
from keras_dl.data.splits import DataSplits, make_splits
from keras_dl.distribute.strategy import make_strategy
from keras_dl.distribute.world import current_world
from keras_dl.divergence import check_finite
from keras_dl.errors import ConfigError
from keras_dl.recipe import Recipe, configure, load_recipe
from keras_dl.runlock import held_by_launcher, open_run_lock

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced (on non-chief ranks only ``metrics`` is filled).

    ``not_registered`` is why the model was not registered when :mod:`keras_dl.gate` refused
    it (the run still ended FINISHED); None when it was registered or registration was off.
    """

    run_id: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    model_uri: str | None = None
    registered_version: int | None = None
    not_registered: str | None = None
    history: dict[str, list[float]] = field(default_factory=dict)
    model: Any = None


def fit(
    exp: Experiment,
    recipe: Recipe | None = None,
    callbacks: Sequence = (),
    run_id: str | None = None,
    lock_run_dir: bool | None = None,
) -> TrainResult:
    """Train ``exp``'s recipe on its table and track everything in MLflow.

    With ``runtime.strategy=horovod`` every rank calls this (under ``horovodrun`` or
    :class:`~keras_dl.distribute.runner.HorovodRunner`); it joins the Horovod world first.

    Args:
        exp: A resolved experiment (see :func:`keras_dl.config.resolve`).
        recipe: The recipe; defaults to ``load_recipe(exp.recipe)``.
        callbacks: Extra Keras callbacks. Defaults to ().
        run_id: An MLflow run to attach to (the launcher creates it, so that it can end it
            FAILED if rank 0 dies). Defaults to None (a new run).
        lock_run_dir: Take ``runtime.run_dir``'s lock on the chief for the whole run (see
            :mod:`keras_dl.runlock`). Defaults to None: yes, unless this is a rank whose
            launcher holds it (:func:`~keras_dl.distribute.runner.launch` does).

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
    world = current_world()
    if exp.train.batch_size % world.size:
        raise ConfigError(
            f"train.batch_size={exp.train.batch_size} is the global batch and must divide evenly "
            f"over {world.size} processes. Use a multiple of {world.size}."
        )
    if lock_run_dir is None:
        lock_run_dir = not held_by_launcher(exp.runtime.run_dir)
    lock = (
        open_run_lock(exp.runtime.run_dir, exp.runtime.lease_seconds)
        if world.is_chief and lock_run_dir
        else None
    )
    if lock is not None:
        lock.acquire()  # before anything is written: a second run in this run_dir stops here
    try:
        return _run(exp, recipe, world, run_id, callbacks, lock)
    finally:
        if lock is not None:
            lock.release()


def _run(exp, recipe, world, run_id, callbacks, lock) -> TrainResult:
    """Read the data, start (or continue) the MLflow run, train, and end the run."""
    import keras

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
    )
    attach, run_id = run_id, None
    if world.is_chief:
        from keras_dl.callbacks.defaults import record_config, record_run_id, resume_run_id

        record_config(exp)

        tracking.check_reachable(exp.tracking.uri)  # MLflow would retry for minutes
        # Re-running with the same runtime.run_dir continues the interrupted run (issue 5).
        attach = attach or resume_run_id(exp)
        run_id = tracking.start_run(exp, tags=data.snapshot.lineage, run_id=attach)
        record_run_id(exp, run_id)
        if lock is not None:
            lock.update(run_id)  # a second run's error names it
    try:
        try:
            result = _fit(exp, recipe, data, strategy, world, run_id, list(callbacks))
        except Exception:
            for split in (data.train, data.validation, data.test):
                if split is not None:
                    split.raise_error()  # the reader's own error, not TF's wrapper of it
            raise
    except Preempted as exc:
        if world.is_chief:  # KILLED, not FAILED: nothing is wrong, rerunning resumes it
            tracking.end_run("KILLED", reason=exc, tags={tracking.PREEMPTED_TAG: exc.signal_name})
        raise
    except BaseException as exc:
        if world.is_chief:
            tracking.end_run("FAILED", reason=exc)
        raise
    if world.is_chief:
        tracking.end_run("FINISHED")
    return result


def _fit(exp, recipe, data: DataSplits, strategy, world, run_id, callbacks) -> TrainResult:
    import keras
    import mlflow

    from keras_dl.callbacks.checkpoint import Checkpoint
    from keras_dl.callbacks.defaults import make_callbacks, prepare_fit
    from keras_dl.callbacks.mlflow_logger import MLflowLogger
    from keras_dl.distribute.lr import scale_learning_rate
    from keras_dl.finish import finish

    with strategy.scope():
        model = recipe.build_model(data, exp)
        options = {"loss": recipe.loss, "metrics": list(recipe.metrics)}
        if recipe.compile_options is not None:
            options.update(recipe.compile_options(data, exp))
        if data.train.weighted and options.get("metrics"):
            # Padding rows (equal steps on every rank) weigh 0: only weighted metrics skip them.
            weighted = options.pop("metrics")
            options["weighted_metrics"] = [*weighted, *(options.get("weighted_metrics") or [])]
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
        model.compile(optimizer=optimizer, **options)
    callbacks = [*make_callbacks(exp, world, run_id, data), *callbacks]
    prepare_fit(callbacks, model, data)  # resume: rank 0 restores the last checkpoint
    if world.is_chief:
        stats = data.train.stats
        mlflow.log_params(
            {
                "data.train_rows": stats.rows,
                "data.files": stats.files,
                **({"data.row_groups": stats.row_groups} if stats.row_groups is not None else {}),
                "train.steps_per_epoch": data.train.steps,
                # Every live row trains once per epoch, across all ranks; the padding on this
                # rank (zero weights, for equal steps) is what fills its last batch.
                "data.rows_trained_per_epoch": stats.rows,
                "data.padded_rows_per_epoch": data.train.padded_rows,
            }
        )
    if exp.runtime.strategy == "horovod":
        from keras_dl.distribute.callbacks import BroadcastState, MetricAverage
        from keras_dl.distribute.stall import StallWatchdog

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
            if isinstance(cb, MLflowLogger):
                cb.flush()  # the steps and epochs before the error still reach the run
        raise
    # Every rank checks the same (averaged, broadcast) values, so every rank stops together.
    check_finite(
        model,
        history.history,
        learning_rate=exp.train.learning_rate,
        factor=exp.callbacks.divergence_factor,
    )
    checkpoint = next(c for c in callbacks if isinstance(c, Checkpoint))
    metrics, model_uri, version, refused = finish(exp, model, data, world, run_id, checkpoint)
    return TrainResult(
        run_id=run_id,
        metrics=metrics,
        model_uri=model_uri,
        registered_version=version,
        not_registered=refused,
        history=dict(history.history),
        model=model,
    )


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
