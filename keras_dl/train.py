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
from keras_dl.distribute.multiworker import local_model
from keras_dl.distribute.strategy import make_strategy
from keras_dl.distribute.world import current_world
from keras_dl.divergence import check_finite
from keras_dl.errors import ConfigError, Preempted
from keras_dl.model.compile import make_optimizer
from keras_dl.recipe import Recipe, check_model, configure, load_recipe
from keras_dl.report.build import log_run_report
from keras_dl.run import Run, open_run
from keras_dl.run.data_params import log_inputs

__all__ = ["TrainResult", "fit", "make_optimizer"]  # make_optimizer: for notebooks

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
    :class:`~keras_dl.launch.HorovodRunner`); it joins the Horovod world first. With
    ``runtime.strategy=multiworker`` every worker calls it with its ``TF_CONFIG`` (under
    :class:`~keras_dl.launch.MultiWorkerRunner`); it joins the strategy's cluster first.

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
        if abs(exp.runtime.np) > 1 and current_world().size == 1:
            raise ConfigError(
                f"runtime.np={exp.runtime.np} asks for {abs(exp.runtime.np)} Horovod ranks, but "
                "fit runs in this one process: it is what each rank runs. Launch the ranks with "
                "keras_dl.launch.launch(exp) (from a notebook; keras-dl train does it), or set "
                "runtime.np=0 to train in this process."
            )
    elif exp.runtime.strategy == "multiworker":
        # Every worker joins the cluster before TensorFlow runs any op (TF's rule) and before
        # it shards data by rank (its task index).
        make_strategy("multiworker", exp.runtime.stall_timeout)
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
    strategy = make_strategy(exp.runtime.strategy, exp.runtime.stall_timeout)
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
        log_inputs(run, data)
    with data.original_errors():  # the reader's own error, not TF's wrapper of it
        return _fit(run, recipe, data, strategy, list(callbacks))


def _fit(run: Run, recipe, data: DataSplits, strategy, callbacks) -> TrainResult:
    from keras_dl.model.compile import build_and_compile
    from keras_dl.model.log import serving_model
    from keras_dl.model.warm_start import init_from_tags, warm_start
    from keras_dl.run import make_callbacks, prepare_fit
    from keras_dl.run.data_params import log_data_params
    from keras_dl.run.finish import finish
    from keras_dl.trivial import run_trivial_loss, trivial_params

    exp, world, run_id = run.exp, run.world, run.run_id
    multiworker = exp.runtime.strategy == "multiworker"
    # Replicas in this process: the multi-worker strategy's count is already the cluster's.
    replicas = strategy.num_replicas_in_sync // (world.size if multiworker else 1)

    with strategy.scope():
        model = build_and_compile(recipe, data, exp, world.size * replicas)
        if multiworker:
            # Every worker creates the optimizer's variables now, in the same order: creating
            # a variable under the strategy is a collective (worker 0's value is broadcast),
            # and a resume's restore on the chief alone would otherwise create them there only.
            model.optimizer.build(model.trainable_variables)
        if exp.init_from and world.is_chief:
            # Before the resume below, which overwrites these weights with a checkpoint's;
            # under Horovod, BroadcastState copies rank 0's weights to the other ranks.
            run.set_tags(init_from_tags(warm_start(model, exp.init_from, exp.tracking.uri)))
    run_callbacks = make_callbacks(run, data)
    trivial = run_trivial_loss(exp.callbacks.trivial_loss_factor, model, data)
    # Built before the model, and its loss, existed.
    stop = run_callbacks.early_stopping
    stop.trivial_loss, stop.trivial_loss_factor = trivial, exp.callbacks.trivial_loss_factor
    # Resume: rank 0 restores the last checkpoint, every rank positions its data after it.
    resume = prepare_fit(run_callbacks, model, data)
    checkpoint = run_callbacks.checkpoint
    if world.is_chief:
        log_data_params(run, data, resume, checkpoint.restored, replicas)
        if trivial is not None:  # the same on a resume: the same labels, the same loss
            run.log_params(trivial_params(trivial))
    callbacks = run_callbacks.ordered(callbacks)
    if exp.runtime.strategy in ("horovod", "multiworker"):
        from keras_dl.callbacks.horovod import BroadcastState, MetricAverage
        from keras_dl.callbacks.stall import StallWatchdog

        # The watchdog first, so it times every collective below; averaged metrics next, so
        # MLflow, early stopping and checkpoints agree on every rank; the broadcast last, so it
        # sends what a resuming callback restored on rank 0. Under the multi-worker strategy
        # the logs are already its mean (the average keeps them) and BatchNorm's statistics
        # are each worker's own (Keras creates them unaggregated): the same callbacks hold.
        callbacks = [
            StallWatchdog(exp.runtime.stall_timeout),
            MetricAverage(),
            *callbacks,
            BroadcastState(),
        ]
    try:
        history = _run_fit(model, data, exp, world, callbacks)
    except BaseException:
        run_callbacks.after_failure()  # Keras skips on_train_end when fit raises
        raise
    if multiworker:
        # What follows (the test split, the signature, the gate) runs on one worker at a time:
        # a model of the strategy would wait in its collectives for the others.
        model = local_model(model, lambda: build_and_compile(recipe, data, exp, world.size))
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


def _run_fit(model, data: DataSplits, exp: Experiment, world, callbacks):
    """``model.fit`` over the training split, validating on the validation split each epoch."""
    from keras_dl.distribute.multiworker import worker_dataset

    val = data.validation
    # Under the multi-worker strategy each worker's datasets are its own (its shard of the
    # training rows, the whole validation split), at its own batch; elsewhere unchanged.
    strategy = model.distribute_strategy
    return model.fit(
        worker_dataset(strategy, data.train.dataset),
        epochs=exp.train.epochs,
        steps_per_epoch=data.train.steps,
        # Repeated: Keras keeps one validation iterator across epochs when validation_steps is
        # set, and under MirroredStrategy an exhausted one raises StopIteration in epoch 2.
        # val.steps is exactly one pass, so every epoch still validates on every row once.
        validation_data=worker_dataset(strategy, val.dataset.repeat()) if val else None,
        validation_steps=val.steps if val else None,
        callbacks=callbacks,
        verbose=exp.train.verbose if world.is_chief else 0,
        shuffle=False,  # the tf.data pipeline shuffles (row groups + buffer)
    )
