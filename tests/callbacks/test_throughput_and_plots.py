"""Throughput, ProgressBar and Plots on a tiny model, with real tf.data input and MLflow."""

from __future__ import annotations

import queue
import time

import keras
import mlflow
import numpy as np
import pytest
import tensorflow as tf

from keras_dl.callbacks import MLflowLogger, Plots, ProgressBar, Throughput
from tests.callbacks.helpers import tiny_data, tiny_model


def _dataset(gate: _StepGate | None = None):
    """Batches of 32 from memory; with ``gate``, each batch is held back by it (Python work)."""
    x, y = tiny_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True).repeat()
    if gate is not None:
        ds = ds.map(
            lambda f, label: (
                tf.ensure_shape(tf.numpy_function(gate.hold, [f], tf.float32), f.shape),
                label,
            )
        )
    return ds.prefetch(1)


class _StepGate(keras.callbacks.Callback):
    """A slow input pipeline: each batch is ready ``delay`` s after the step that takes it began.

    A plain ``sleep(delay)`` per batch runs in tf.data's threads while the step before works,
    so a step waits ``delay`` minus that step's own time: on a loaded host, where the steps
    slow down, the wait shrinks to nothing. Here the pipeline makes batch k only once step k
    began (callbacks run before the step takes its batch), so every step waits ``delay``
    however long its own work takes. Put it after :class:`Throughput` in the callbacks list.
    """

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay
        self.began: queue.Queue[float | None] = queue.Queue()

    def on_train_batch_begin(self, batch, logs=None):
        self.began.put(time.time())

    def on_train_end(self, logs=None):
        for _ in range(4):  # batches tf.data asked for ahead: release them, fit is over
            self.began.put(None)

    def hold(self, features):
        began = self.began.get(timeout=120)
        if began is not None:
            time.sleep(max(0.0, began + self.delay - time.time()))
        return features


def test_figures_reach_the_logs_per_epoch_and_every_n_steps():
    tp = Throughput(batch_size=32, log_every_n_steps=2)
    seen = []
    grab = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: seen.append(dict(logs))
    )
    model = tiny_model()
    history = model.fit(
        tp.instrument(_dataset()),
        epochs=2,
        steps_per_epoch=4,
        verbose=0,
        shuffle=False,
        callbacks=[tp, grab],
    )
    for key in ("samples_per_sec", "step_time_ms"):
        assert len(history.history[key]) == 2 and all(v > 0 for v in history.history[key]), key
    # From memory the batches are ready before the steps ask: the wait can be exactly 0.
    assert len(history.history["input_wait_fraction"]) == 2
    assert [("samples_per_sec" in logs) for logs in seen] == [False, True] * 4
    # samples/s is over the epoch's wall time, so it cannot beat the pure step time.
    last = tp.epoch_stats
    assert last["samples_per_sec"] <= 32 / (last["step_time_ms"] / 1000) * 1.001
    assert 0 <= last["input_wait_fraction"] <= 1


def test_input_wait_sees_a_slow_input_pipeline():
    model = tiny_model()
    stats = {}
    for delay in (0.0, 0.05):
        tp = Throughput(batch_size=32, wait_every_n_steps=1)  # every step, not one in 8
        gate = _StepGate(delay) if delay else None
        model.fit(
            tp.instrument(_dataset(gate)),
            epochs=2,
            steps_per_epoch=6,
            verbose=0,
            shuffle=False,
            callbacks=[tp, gate] if gate else [tp],
        )
        stats[delay] = tp.epoch_stats
    slow, fast = stats[0.05], stats[0.0]
    # Each step waits 50 ms for its batch: the wait covers the delay, step after step.
    assert slow["input_wait_ms"] >= 50 and slow["step_time_ms"] >= slow["input_wait_ms"], slow
    assert fast["input_wait_ms"] < slow["input_wait_ms"] - 25, stats
    # The share of step time is reported too (how much of it depends on the steps' own time).
    for figures in (slow, fast):
        assert 0 <= figures["input_wait_fraction"] <= 1, figures
    assert slow["input_wait_fraction"] > fast["input_wait_fraction"], stats


def test_without_instrumented_input_there_is_no_wait_figure_and_no_batch_size_gives_steps():
    tp = Throughput()
    history = tiny_model().fit(
        _dataset(), epochs=1, steps_per_epoch=3, verbose=0, shuffle=False, callbacks=[tp]
    )
    assert "steps_per_sec" in history.history and "input_wait_fraction" not in history.history


def test_progress_bar_shows_samples_per_second_and_replaces_the_default_bar(capsys):
    tiny_model().fit(
        _dataset(),
        epochs=2,
        steps_per_epoch=3,
        verbose=1,
        shuffle=False,
        callbacks=[ProgressBar(batch_size=32)],
    )
    out = capsys.readouterr().out
    assert "samples/s:" in out and "Epoch 2/2" in out
    assert out.count("Epoch 1/2") == 1  # one bar, not Keras' own as well
    assert "3/3" in out


@pytest.mark.slow  # 24 s on 2 cores
def test_plots_log_curves_and_a_confusion_matrix_of_the_held_out_data(mlflow_uri, tmp_path):
    x, y = tiny_data()
    model = tiny_model()
    plots = Plots(confusion_data=(x[:96], y[:96]), output_dir=str(tmp_path))
    tp = Throughput(batch_size=32)
    with mlflow.start_run() as run:
        model.fit(
            x,
            y,
            epochs=3,
            batch_size=32,
            validation_split=0.25,
            verbose=0,
            callbacks=[tp, MLflowLogger(), plots],
        )
    client = mlflow.MlflowClient(mlflow_uri)
    names = sorted(a.path for a in client.list_artifacts(run.info.run_id, "plots"))
    assert names == ["plots/confusion_matrix.png", "plots/curves.png"]
    for p in plots.paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    matrix = plots._confusion()
    predicted = model.predict(x[:96], verbose=0).argmax(1)
    assert matrix.sum() == 96 and np.trace(matrix) == (predicted == y[:96]).sum()
    assert matrix[1].sum() == (y[:96] == 1).sum()  # rows are the true classes
    assert set(plots.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}


def test_plots_skip_the_confusion_matrix_for_regression(tmp_path):
    x, _ = tiny_data()
    y = x.sum(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    plots = Plots(confusion_data=(x, y), output_dir=str(tmp_path))
    model.fit(x, y, epochs=2, verbose=0, callbacks=[plots])
    assert [p.name for p in plots.paths] == ["curves.png"]


@pytest.mark.parametrize("cls", [Throughput, Plots, ProgressBar])
def test_every_callback_is_a_plain_keras_callback(cls):
    assert issubclass(cls, keras.callbacks.Callback)
