"""EarlyStopping on a tiny model: thresholds, patience, best weights, NaN, MLflow record."""

from __future__ import annotations

import keras
import mlflow
import numpy as np
import pytest

from keras_dl.callbacks import EarlyStopping
from tests.callbacks.helpers import tiny_data, tiny_model


def _losses(epochs: int) -> list[float]:
    x, y = tiny_data()
    history = tiny_model().fit(x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=0)
    return history.history["loss"]


def test_stopping_threshold_stops_at_the_first_epoch_better_than_it(capsys):
    losses = _losses(6)
    threshold = (losses[2] + losses[3]) / 2  # crossed at epoch index 3
    x, y = tiny_data()
    model = tiny_model()
    stop = EarlyStopping(monitor="loss", stopping_threshold=threshold)
    history = model.fit(x, y, epochs=6, batch_size=32, shuffle=False, verbose=0, callbacks=[stop])
    assert history.epoch == [0, 1, 2, 3]
    assert stop.stop_reason == "stopping_threshold" and stop.stopped_epoch == 3
    assert f"passed the stopping threshold {threshold} at epoch 4" in capsys.readouterr().out
    # Reusable: the next fit (on the trained model) starts from a clean state and reports
    # its own, earlier, stop.
    history = model.fit(x, y, epochs=6, batch_size=32, shuffle=False, verbose=0, callbacks=[stop])
    assert stop.stopped_epoch == history.epoch[-1] < 3


def test_divergence_threshold_stops_a_diverging_training():
    rng = np.random.default_rng(0)
    x = (10 * rng.normal(size=(64, 4))).astype("float32")
    y = x.sum(1, keepdims=True)

    def diverging():  # plain SGD far above the stable step size: the loss grows each epoch
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.SGD(0.02), "mse")
        return m

    losses = diverging().fit(x, y, epochs=5, batch_size=16, shuffle=False, verbose=0)
    losses = losses.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] > 1e3 * losses[0]
    first = next(i for i, v in enumerate(losses) if v > 1e6)
    # divergence_factor=0: the default factor (10x the first epoch) would stop it earlier.
    stop = EarlyStopping(monitor="loss", divergence_threshold=1e6, divergence_factor=0)
    history = diverging().fit(
        x, y, epochs=5, batch_size=16, shuffle=False, verbose=0, callbacks=[stop]
    )
    assert stop.stop_reason == "divergence_threshold" and stop.stopped_epoch == first
    assert history.epoch[-1] == first < 4


def test_patience_with_min_delta_and_restore_best_weights():
    x, y = tiny_data()
    model = tiny_model()
    snapshots = {}
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: snapshots.__setitem__(epoch, model.get_weights())
    )
    # No later epoch improves the loss by 100, so epoch 0 stays the best.
    stop = EarlyStopping(monitor="loss", min_delta=100, patience=2, restore_best_weights=True)
    history = model.fit(
        x, y, epochs=10, batch_size=32, verbose=0, callbacks=[keep, stop], shuffle=False
    )
    assert history.epoch == [0, 1, 2]  # two epochs without improvement after the best
    assert stop.stop_reason == "patience" and stop.best_epoch == 0
    for got, want in zip(model.get_weights(), snapshots[0]):
        np.testing.assert_array_equal(got, want)
    assert not all(np.array_equal(a, b) for a, b in zip(snapshots[2], snapshots[0]))


def test_auto_mode_maximises_accuracy_and_minimises_loss():
    assert EarlyStopping(monitor="val_accuracy").mode == "max"
    assert EarlyStopping(monitor="val_auc").mode == "max"
    assert EarlyStopping(monitor="val_loss").mode == "min"
    with pytest.raises(ValueError, match="mode='up' is not one of auto, min, max"):
        EarlyStopping(mode="up")


def test_nan_loss_stops_with_epoch_and_step_and_is_logged(mlflow_uri, capsys):
    x, _ = tiny_data()
    y = x.sum(1)
    y[70] = np.nan  # row 70: the third batch of 32 (rows 64-95) of the first epoch
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    stop = EarlyStopping(monitor="loss", patience=3)
    with mlflow.start_run() as run:
        history = model.fit(
            x, y, epochs=5, batch_size=32, shuffle=False, verbose=0, callbacks=[stop]
        )
    assert history.epoch == [0]
    assert stop.stop_reason == "non_finite" and stop.stopped_epoch == 0
    assert "loss is nan at epoch 1, step 3: stopping training" in capsys.readouterr().out
    data = mlflow.MlflowClient(mlflow_uri).get_run(run.info.run_id).data
    assert data.params["early_stopping.reason"] == "non_finite"
    assert data.metrics["early_stopping.stopped_epoch"] == 0


def test_why_it_stopped_is_logged_to_the_run(mlflow_uri):
    losses = _losses(4)
    x, y = tiny_data()
    stop = EarlyStopping(monitor="loss", stopping_threshold=(losses[1] + losses[2]) / 2)
    with mlflow.start_run() as run:
        tiny_model().fit(x, y, epochs=4, batch_size=32, shuffle=False, verbose=0, callbacks=[stop])
    data = mlflow.MlflowClient(mlflow_uri).get_run(run.info.run_id).data
    assert data.params["early_stopping.reason"] == "stopping_threshold"
    assert data.metrics["early_stopping.stopped_epoch"] == 2
    assert data.metrics["early_stopping.best"] == pytest.approx(stop.best)
