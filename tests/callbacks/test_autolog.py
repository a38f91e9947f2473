"""keras_dl's callbacks beside what Keras users already run: TensorBoard and MLflow autolog."""

from __future__ import annotations

import keras
import mlflow
import numpy as np
import pytest

from keras_dl.callbacks import Checkpoint, EarlyStopping, MLflowLogger, Throughput
from keras_dl.callbacks.checkpoint import list_checkpoints
from tests.conftest import runs_in

EPOCHS = 3


@pytest.fixture
def autolog():
    mlflow.tensorflow.autolog(log_models=False)
    yield
    mlflow.tensorflow.autolog(disable=True)


def _fit(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((256, 8), dtype=np.float32)
    y = (x.sum(1) > 4).astype("int32")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        x,
        y,
        validation_split=0.25,
        epochs=EPOCHS,
        batch_size=32,
        verbose=0,
        callbacks=[
            Checkpoint(tmp_path / "ckpt"),
            EarlyStopping(monitor="val_loss", patience=5),
            Throughput(batch_size=32),
            MLflowLogger(log_every_n_steps=4),
            keras.callbacks.TensorBoard(str(tmp_path / "tb")),
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize("own_run", [True, False], ids=["in-own-run", "autolog-starts-run"])
def test_one_run_one_value_per_metric_and_epoch_with_tensorboard_and_autolog(
    mlflow_uri, autolog, tmp_path, own_run
):
    if own_run:
        with mlflow.start_run():
            _fit(tmp_path)
    else:
        _fit(tmp_path)
    (run,) = runs_in(mlflow_uri)  # no second run from either side
    client = mlflow.MlflowClient(mlflow_uri)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "samples_per_sec"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps == list(range(EPOCHS)), (key, steps)  # logged once, not by both
    assert "step_loss" in run.data.metrics  # keras_dl's step metrics keep their own names
    params = run.data.params
    assert params["fit.epochs"] == str(EPOCHS) and params["opt_name"].startswith("adam")
    assert params["early_stopping.reason"] == "completed"
    assert list((tmp_path / "tb" / "train").glob("events.out.tfevents.*"))
    assert len(list_checkpoints(tmp_path / "ckpt")) == EPOCHS
    assert mlflow.active_run() is None
