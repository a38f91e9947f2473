"""The one training path: ``fit(experiment)``.

Data flows one way: table snapshot -> Petastorm reader -> tf.data -> ``model.fit`` under the
chosen strategy -> MLflow (chief only). Every step that writes is gated on the chief, and the
MLflow run always ends: FINISHED on success, FAILED on any error or interrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keras_dl import tracking
from keras_dl.config import Experiment, save
from keras_dl.data.splits import DataSplits, make_splits
from keras_dl.distribute.strategy import make_strategy
from keras_dl.distribute.world import current_world
from keras_dl.errors import ConfigError
from keras_dl.recipe import Recipe, load_recipe

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced (on non-chief ranks only ``metrics`` is filled)."""

    run_id: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    model_uri: str | None = None
    registered_version: int | None = None
    history: dict[str, list[float]] = field(default_factory=dict)
    model: Any = None


def fit(exp: Experiment, recipe: Recipe | None = None, callbacks: Sequence = ()) -> TrainResult:
    """Train ``exp``'s recipe on its table and track everything in MLflow.

    Args:
        exp: A resolved experiment (see :func:`keras_dl.config.resolve`).
        recipe: The recipe; defaults to ``load_recipe(exp.recipe)``.
        callbacks: Extra Keras callbacks. Defaults to ().

    Returns:
        The run id, test metrics, model URI and registered version.
    """
    import keras

    recipe = recipe or load_recipe(exp.recipe)
    if recipe.prepare is not None:
        recipe = recipe.prepare(exp)  # table-dependent parts, e.g. a string label's classes
    world = current_world()
    if exp.train.batch_size % world.size:
        raise ConfigError(
            f"train.batch_size={exp.train.batch_size} is the global batch and must divide evenly "
            f"over {world.size} processes. Use a multiple of {world.size}."
        )
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
    run_id = None
    if world.is_chief:
        save(exp, Path(exp.runtime.run_dir) / "config.yaml")
        run_id = tracking.start_run(exp, tags=data.snapshot.lineage)
    try:
        try:
            result = _fit(exp, recipe, data, strategy, world, run_id, list(callbacks))
        except Exception:
            for split in (data.train, data.validation, data.test):
                if split is not None:
                    split.raise_error()  # the reader's own error, not TF's wrapper of it
            raise
    except BaseException:
        if world.is_chief:
            tracking.end_run("FAILED")
        raise
    if world.is_chief:
        tracking.end_run("FINISHED")
    return result


def _fit(exp, recipe, data: DataSplits, strategy, world, run_id, callbacks) -> TrainResult:
    import keras
    import mlflow

    from keras_dl.callbacks.mlflow_logger import MLflowLogger

    with strategy.scope():
        model = recipe.build_model(data, exp)
        options = {"loss": recipe.loss, "metrics": list(recipe.metrics)}
        if recipe.compile_options is not None:
            options.update(recipe.compile_options(data, exp))
        lr = exp.train.learning_rate
        if exp.train.lr_schedule == "cosine":
            lr = keras.optimizers.schedules.CosineDecay(lr, exp.train.epochs * data.train.steps)
        model.compile(optimizer=make_optimizer(exp.train.optimizer, lr), **options)
    if world.is_chief:
        callbacks = [MLflowLogger(run_id=run_id, end_run=False), *callbacks]
        mlflow.log_params(
            {
                "data.train_rows": data.train.stats.rows,
                "data.row_groups": data.train.stats.row_groups,
                "train.steps_per_epoch": data.train.steps,
            }
        )
    val = data.validation
    history = model.fit(
        data.train.dataset,
        epochs=exp.train.epochs,
        steps_per_epoch=data.train.steps,
        validation_data=val.dataset if val else None,
        validation_steps=val.steps if val else None,
        callbacks=callbacks,
        verbose=exp.train.verbose if world.is_chief else 0,
        shuffle=False,  # the tf.data pipeline shuffles (row groups + buffer)
    )
    metrics: dict[str, float] = {}
    if data.test is not None:
        scores = model.evaluate(
            data.test.dataset, steps=data.test.steps, return_dict=True, verbose=0
        )
        metrics = {f"test_{k}": float(v) for k, v in scores.items()}
    skipped = data.bad_images_skipped()  # data.on_bad_image=skip: rows dropped, every read
    if skipped:
        log.warning("Skipped %d undecodable image(s) (counted over every epoch read).", skipped)
        metrics["data.bad_images_skipped"] = float(skipped)
    result = TrainResult(run_id=run_id, metrics=metrics, history=dict(history.history), model=model)
    if not world.is_chief:
        return result
    if metrics:
        mlflow.log_metrics(metrics)
    if exp.tracking.log_model:
        sample = _sample_input(data)
        lineage = {**data.snapshot.lineage, "keras_dl.recipe": exp.recipe, "run_id": run_id}
        result.model_uri, result.registered_version = tracking.log_keras_model(
            model, sample, exp.tracking.registered_model, tags=lineage
        )
    return result


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


def _sample_input(data: DataSplits, rows: int = 5):
    """A few rows of model input, as numpy, for the model signature."""
    split = data.test or data.validation or data.train
    features = next(iter(split.dataset.take(1)))
    if isinstance(features, tuple):
        features = features[0]
    if isinstance(features, dict):
        return {k: v.numpy()[:rows] for k, v in features.items()}
    return features.numpy()[:rows]
