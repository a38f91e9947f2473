"""The recipe's model, built and compiled for this run: its loss and metrics (weighted when
rows carry weights), the learning-rate schedule scaled to the replicas, and the optimizer,
averaged over Horovod ranks when they train together."""

from __future__ import annotations

from keras_dl.config import Experiment
from keras_dl.errors import ConfigError


def build_and_compile(recipe, data, exp: Experiment, replicas: int):
    """Build ``recipe``'s model for ``data`` and compile it; call inside the strategy's scope.

    Args:
        recipe: The :class:`~keras_dl.recipe.Recipe`.
        data: The :class:`~keras_dl.data.splits.DataSplits` it trains on.
        exp: The resolved experiment.
        replicas: Replicas training together (ranks times devices), for
            ``runtime.lr_scaling``.
    """
    import keras

    from keras_dl.distribute.lr import scale_learning_rate
    from keras_dl.model.compile_options import compile_weighted

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
        replicas=replicas,
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
    return model


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
