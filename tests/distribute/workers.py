"""Functions and callbacks that the distributed tests ship to real Horovod ranks.

They live in an importable module (not in a test file) so that they pickle by reference: the
ranks import ``tests.distribute.workers`` from the repository on their ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import signal
import time

import keras


class Recorder(keras.callbacks.Callback):
    """Per epoch: the logs this rank's callbacks see, and its own (local, unaveraged) metrics."""

    def on_train_begin(self, logs=None):
        self.epochs = []
        self.start = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.start is None:  # after every on_train_begin: what the first step starts from
            self.start = digest(self.model.get_weights())

    def on_epoch_end(self, epoch, logs=None):
        # Without validation the model's metric objects still hold this rank's epoch values.
        local = {k: float(v) for k, v in self.model.get_metrics_result().items()}
        self.epochs.append({"logs": {k: float(v) for k, v in logs.items()}, "local": local})


class Fault(keras.callbacks.Callback):
    """On ``rank`` at ``epoch``/``batch``: raise, SIGKILL or SIGTERM this process; note the time
    first. With ``once``, only when the stamp file does not exist yet (the first attempt)."""

    def __init__(self, mode: str, rank: int, epoch: int, batch: int, stamp: str, once=False):
        super().__init__()
        self.mode, self.rank, self.epoch, self.batch, self.stamp = mode, rank, epoch, batch, stamp
        self.once = once
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        from keras_dl.distribute.world import current_world  # Horovod's rank, or a worker's

        if current_world().rank != self.rank or (self._epoch, batch) != (self.epoch, self.batch):
            return
        if self.once and os.path.exists(self.stamp):
            return
        with open(self.stamp, "w") as f:
            f.write(str(time.time()))
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "sigterm":  # as a preempted node's rank gets it
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise RuntimeError(f"injected fault on rank {self.rank} at epoch {self.epoch}")


def train_and_report(exp, run_id=None):
    """Train with a Recorder; rank 0 returns its TrainResult plus every rank's digest and logs."""
    import horovod.tensorflow as hvd

    from keras_dl.train import fit

    recorder = Recorder()
    result = fit(exp, callbacks=[recorder], run_id=run_id)
    mine = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "digest": digest(result.model.get_weights()),
        "start_digest": recorder.start,
        "epochs": recorder.epochs,
        "policy": keras.config.dtype_policy().name,
        "optimizer_classes": [c.__name__ for c in type(result.model.optimizer).__mro__],
    }
    ranks = hvd.allgather_object(mine)  # collective: every rank's report, in rank order
    result.model = None
    return {"result": result, "ranks": ranks}


def train_and_report_to(exp, run_id=None, folder=""):
    """:func:`train_and_report` for any engine: each process writes its report to
    ``folder/rank.N.json`` (rank, size, digest, per-epoch logs); worker 0 returns its result."""
    import json

    from keras_dl.distribute.world import current_world
    from keras_dl.train import fit

    recorder = Recorder()
    result = fit(exp, callbacks=[recorder], run_id=run_id)
    world = current_world()
    mine = {
        "rank": world.rank,
        "size": world.size,
        "digest": digest(result.model.get_weights()),
        "start_digest": recorder.start,
        "epochs": recorder.epochs,
    }
    with open(os.path.join(folder, f"rank.{world.rank}.json"), "w") as f:
        json.dump(mine, f)
    result.model = None
    return result


def train_with_fault(
    exp, run_id=None, mode="raise", rank=1, epoch=1, batch=2, stamp="", once=False
):
    """Train, injecting a fault on one rank mid-epoch."""
    from keras_dl.train import fit

    result = fit(exp, callbacks=[Fault(mode, rank, epoch, batch, stamp, once)], run_id=run_id)
    return result.history


def own_model_fit(seed_by_rank=True, fp16=False, warmup_steps=0):
    """A plain Keras model and ``model.fit`` with keras_dl's Horovod pieces, nothing else.

    Each rank starts from different random weights (seeded by rank) and its own random data, so
    only the broadcast and the gradient averaging can make the ranks end identical.
    """
    import hashlib

    import numpy as np

    from keras_dl.callbacks.horovod import BroadcastState, MetricAverage
    from keras_dl.distribute import horovod as khvd
    from keras_dl.distribute.lr import scale_learning_rate

    hvd = khvd.init()
    keras.utils.set_random_seed(hvd.rank() if seed_by_rank else 0)
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )
    initial = hashlib.sha256(model.get_weights()[0].tobytes()).hexdigest()
    lr = scale_learning_rate(0.01, "linear", hvd.size(), warmup_steps=warmup_steps)
    opt = khvd.distributed_optimizer(keras.optimizers.Adam(lr), fp16_allreduce=fp16)
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    history = model.fit(
        x, y, batch_size=32, epochs=2, callbacks=[MetricAverage(), BroadcastState()], verbose=0
    )
    weights = b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
    mine = {
        "initial": initial,
        "final": hashlib.sha256(weights).hexdigest(),
        "loss": history.history["loss"],
        "lr": float(opt.learning_rate),
        "iterations": int(opt.iterations),
    }
    return hvd.allgather_object(mine)


class SleepAfterStep(keras.callbacks.Callback):
    """On ``rank``, sleep ``seconds`` after step ``batch`` (between the collectives of two steps)."""

    def __init__(self, rank: int, batch: int, seconds: float):
        super().__init__()
        self.rank, self.batch, self.seconds = rank, batch, seconds

    def on_train_batch_end(self, batch, logs=None):
        import horovod.tensorflow as hvd

        if hvd.rank() == self.rank and batch == self.batch:
            time.sleep(self.seconds)


def fit_with_a_stalled_rank(timeout: float):
    """A tiny model.fit on every rank; rank 1 stalls after step 2 for 600 s."""
    import numpy as np

    from keras_dl.callbacks.horovod import BroadcastState, MetricAverage
    from keras_dl.callbacks.stall import StallWatchdog
    from keras_dl.distribute import horovod as khvd

    khvd.init()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(khvd.distributed_optimizer(keras.optimizers.SGD(0.01)), "mse", jit_compile=False)
    x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
    callbacks = [
        StallWatchdog(timeout),
        MetricAverage(),
        SleepAfterStep(1, 2, 600),
        BroadcastState(),
    ]
    model.fit(x, y, batch_size=8, epochs=1, callbacks=callbacks, verbose=0)


def train_for_weights(exp, run_id=None, sigterm_at=None, stamp=""):
    """Train (SIGTERM to rank 1 once at ``sigterm_at`` = (epoch, batch)); return every rank's
    final weights, in rank order, from rank 0."""
    import horovod.tensorflow as hvd

    from keras_dl.train import fit

    callbacks = []
    if sigterm_at is not None:
        callbacks.append(Fault("sigterm", 1, *sigterm_at, stamp=stamp, once=True))
    result = fit(exp, callbacks=callbacks, run_id=run_id)
    return hvd.allgather_object(result.model.get_weights())


class RowsSeen(keras.metrics.Metric):
    """Rows trained on this rank: the sum of the sample weights (padding weighs 0)."""

    def __init__(self, name="rows_seen", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        if sample_weight is None:
            seen = ops.cast(ops.shape(y_true)[0], "float32")
        else:
            seen = ops.sum(ops.cast(sample_weight, "float32"))
        self.total.assign_add(seen)

    def result(self):
        return self.total

    def reset_state(self):
        self.total.assign(0.0)


def train_counting_rows(exp, run_id=None):
    """Train with a rows-seen metric; every rank returns its own rows per epoch and steps."""
    import dataclasses

    import horovod.tensorflow as hvd

    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    recipe = load_recipe(exp.recipe)
    recipe = dataclasses.replace(recipe, metrics=(*recipe.metrics, RowsSeen()))
    recorder = Recorder()
    result = fit(exp, recipe=recipe, callbacks=[recorder], run_id=run_id)
    mine = {
        "rank": hvd.rank(),
        "rows": [e["local"]["rows_seen"] for e in recorder.epochs],
        "logged": [e["logs"]["rows_seen"] for e in recorder.epochs],
        "test_accuracy": result.metrics.get("test_accuracy"),
    }
    return hvd.allgather_object(mine)


def digest(weights) -> str:
    """One hash of a model's weight arrays, to compare models across ranks and runs."""
    import hashlib

    import numpy as np

    return hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()


def init_late_on_rank_1(pause: float) -> None:
    """Rank 1 reaches ``hvd.init()`` ``pause`` seconds after rank 0 (a slow start, or an error of
    its own before init): rank 0's Gloo rendezvous times out waiting for it."""
    import os
    import time

    import horovod.tensorflow as hvd

    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(pause)
    hvd.init()


def op_before_the_strategy(exp, run_id=None) -> None:
    """A worker main that runs a TensorFlow op before it creates the multi-worker strategy."""
    import tensorflow as tf

    from keras_dl.distribute import multiworker

    tf.constant(1.0) + 1.0
    multiworker.init()
