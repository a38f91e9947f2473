"""Keras 3 callbacks for Horovod training: broadcast the starting state, average the metrics.

Both work in any ``model.fit`` once Horovod is initialized (see :mod:`keras_dl.distribute.horovod`),
or under TF's multi-worker strategy (:mod:`keras_dl.distribute.multiworker`: there the logs are
already the strategy's mean, and the average leaves them so), and do nothing in a single process. Order matters::

    callbacks = [MetricAverage(), *your_callbacks, BroadcastState()]

``MetricAverage`` goes first, so that early stopping, checkpointing and logging decide on the
same (averaged) numbers on every rank. ``BroadcastState`` goes last, so that it broadcasts what
a restoring callback (``BackupAndRestore``, a resume) loaded on rank 0 in ``on_train_begin``.
"""

from __future__ import annotations

import keras

from keras_dl.distribute import collective


class BroadcastState(keras.callbacks.Callback):
    """At the start of ``fit``, copy rank 0's model and optimizer state to every rank.

    Randomly initialised weights differ per rank, and after a resume only rank 0 may have read
    the checkpoint; without this broadcast the ranks would train different models.

    Args:
        root_rank: The rank whose state wins. Defaults to 0.
    """

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None):
        if collective.size() == 1:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            # Build the slots now, so every rank broadcasts the same list of variables.
            optimizer.build(self.model.trainable_variables)
        # Collective: all ranks overwrite their weights (trainable and not, e.g. BatchNorm
        # statistics) and optimizer variables (iterations, slots) with rank 0's values.
        collective.broadcast_variables(self.model.variables, self.root_rank, prefix="model")
        if optimizer is not None:
            collective.broadcast_variables(optimizer.variables, self.root_rank, prefix="optimizer")


class MetricAverage(keras.callbacks.Callback):
    """At the end of each epoch, replace every metric in ``logs`` by its mean over all ranks.

    Each rank's ``loss``/``accuracy`` is the mean over its own shard; their average is the
    metric over all the data, the same on every rank. The callbacks after this one see the
    averaged values (Keras passes the same ``logs`` dict to each callback in turn).

    It also averages the model's non-trainable statistics (BatchNorm moving mean and variance),
    which each rank updates from its own shard, so the ranks end every epoch with the same
    model and rank 0's checkpoint stands for all of them.

    Args:
        average_statistics: Average non-trainable float variables too. Defaults to True.
    """

    def __init__(self, average_statistics: bool = True):
        super().__init__()
        self.average_statistics = average_statistics

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or collective.size() == 1:
            return
        numbers = {}
        for key, value in logs.items():
            try:
                numbers[key] = float(value)
            except (TypeError, ValueError):
                continue  # e.g. a learning-rate schedule object: not averaged
        # Collective: every rank sends its epoch metrics and gets back the mean of all ranks'.
        logs.update(collective.allreduce_mean(numbers, prefix=f"epoch{epoch}"))
        if self.average_statistics:
            # Collective: BatchNorm statistics and the like become the mean of all ranks'.
            collective.average_variables(self.model.non_trainable_variables, prefix=f"stats{epoch}")
