"""MLflowLogger against a real SQLite store and a real ``mlflow server`` that goes away."""

from __future__ import annotations

import time
import warnings

import keras
import mlflow
import numpy as np
import pytest

from keras_dl.callbacks import MLflowLogger
from tests.callbacks.helpers import MlflowServer, tiny_data, tiny_model
from tests.conftest import runs_in


def test_new_run_gets_params_epoch_metrics_and_model_with_signature(mlflow_uri):
    x, y = tiny_data()
    model = tiny_model()
    logger = MLflowLogger(
        experiment="tiny", params={"note": "hello"}, log_model=True, sample_input=x[:4]
    )
    model.fit(x, y, epochs=3, batch_size=32, verbose=0, validation_split=0.25, callbacks=[logger])
    (run,) = runs_in(mlflow_uri)
    assert run.info.run_id == logger.run_id and run.info.status == "FINISHED"
    assert mlflow.active_run() is None
    params = run.data.params
    assert params["note"] == "hello" and params["fit.epochs"] == "3"
    assert params["optimizer.name"] == "Adam" and params["keras.param_count"] == "131"
    client = mlflow.MlflowClient(mlflow_uri)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [0, 1, 2], key
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert losses == pytest.approx(model.history.history["loss"])
    loaded = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    assert str(loaded.metadata.signature.inputs.inputs[0].shape) == "(-1, 4)"
    np.testing.assert_allclose(
        np.asarray(loaded.predict(x[:4].astype("float64"))),
        model.predict(x[:4], verbose=0),
        atol=1e-5,
    )
    assert logger.unsent == 0


def test_attaches_to_the_active_run_and_continues_global_steps(mlflow_uri):
    x, y = tiny_data()
    model = tiny_model()
    logger = MLflowLogger(log_every_n_steps=2)
    with mlflow.start_run() as run:
        model.fit(x, y, epochs=1, batch_size=32, verbose=0, callbacks=[logger])
        # A second fit on the same model continues the optimizer's step count: no repeats.
        logger.step_offset = 1
        model.fit(x, y, epochs=1, batch_size=32, verbose=0, callbacks=[logger])
        assert mlflow.active_run().info.run_id == run.info.run_id  # not ended by the logger
    client = mlflow.MlflowClient(mlflow_uri)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "step_loss")] == [2, 4, 6, 8]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]


def test_a_value_the_store_rejects_is_dropped_and_does_not_block_the_rest(mlflow_uri):
    x, y = tiny_data()
    logger = MLflowLogger(params={"note": "new"})
    with mlflow.start_run() as run:
        mlflow.log_param("note", "old")  # MLflow refuses to change a param's value
        with pytest.warns(UserWarning, match="MLflow rejected params"):
            tiny_model().fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[logger])
    data = mlflow.MlflowClient(mlflow_uri).get_run(run.info.run_id).data
    assert data.params["note"] == "old" and "loss" in data.metrics
    assert logger.dropped == 6 and logger.unsent == 0  # the 6 params of that one batch


def test_no_server_at_all_never_fails_fit_and_says_what_was_lost(tmp_path):
    from tests.callbacks.helpers import _free_port

    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    logger = MLflowLogger(tracking_uri=uri, flush_timeout=1, retry_interval=0.2)
    x, y = tiny_data()
    with pytest.warns(UserWarning) as caught:
        history = tiny_model().fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[logger])
    assert len(history.history["loss"]) == 2
    assert logger.run_id is None and logger.unsent == 5 + 2 * 2  # params, then 2 epochs
    messages = " ".join(str(w.message) for w in caught)
    assert f"MLflow at {uri} is not answering" in messages
    assert f"{logger.unsent} value(s) for run None could not be sent" in messages


class _Fails(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("training fails after epoch 1")


def test_after_a_failed_fit_a_server_that_does_not_answer_is_not_waited_for(tmp_path):
    """``flush(stopped=True)`` (keras_dl's runs call it when ``fit`` raises): one last attempt,
    not the flush_timeout's wait, which would only delay the job's end (a rank whose host is cut
    off the tracking server waited its 30 s); it says what is not in the run."""
    from tests.callbacks.helpers import _free_port

    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    logger = MLflowLogger(tracking_uri=uri, flush_timeout=60, retry_interval=0.2)
    x, y = tiny_data()
    with pytest.warns(UserWarning) as caught:
        with pytest.raises(RuntimeError, match="training fails"):
            tiny_model().fit(x, y, epochs=3, verbose=0, callbacks=[logger, _Fails()])
        start = time.monotonic()
        logger.flush(stopped=True)
        took = time.monotonic() - start
    assert took < 15, f"waited {took:.0f} s of the 60 s flush_timeout"
    assert logger.unsent == 5 + 2  # the params, then epoch 1's loss and accuracy
    messages = " ".join(str(w.message) for w in caught)
    assert f"training stopped and MLflow at {uri} is not answering: 7 value(s)" in messages


def test_after_a_failed_fit_a_server_that_answers_gets_every_value(mlflow_uri):
    logger = MLflowLogger(flush_timeout=30, retry_interval=0.2)
    x, y = tiny_data()
    with pytest.raises(RuntimeError, match="training fails"):
        tiny_model().fit(x, y, epochs=3, verbose=0, callbacks=[logger, _Fails()])
    logger.flush(stopped=True)
    assert logger.unsent == 0
    data = mlflow.MlflowClient(mlflow_uri).get_run(logger.run_id).data
    assert {"loss", "accuracy"} <= set(data.metrics)


class _Outage(keras.callbacks.Callback):
    """Stops the tracking server after epoch ``down`` and starts it again after epoch ``up``."""

    def __init__(self, server: MlflowServer, down: int, up: int, check):
        super().__init__()
        self.server, self.down, self.up, self.check = server, down, up, check
        self.flushed_before_end = False

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.down:
            self.server.stop()
        elif epoch == self.up:
            time.sleep(1.0)  # let the logger try (and fail) while the server is down
            self.server.start()
        elif epoch > self.up:
            # The values buffered during the outage reach the server while training goes on.
            deadline = time.monotonic() + 20
            while not self.flushed_before_end and time.monotonic() < deadline:
                self.flushed_before_end = self.check(self.up)
                time.sleep(0.2)


@pytest.mark.slow
def test_server_that_goes_away_mid_training_gets_every_value_when_back(tmp_path):
    server = MlflowServer(tmp_path)
    server.start()
    try:
        client = mlflow.MlflowClient(server.uri)
        x, y = tiny_data()
        model = tiny_model()
        logger = MLflowLogger(
            tracking_uri=server.uri, experiment="outage", retry_interval=0.3, flush_timeout=20
        )

        def has_epochs(last):
            try:
                steps = {m.step for m in client.get_metric_history(logger.run_id, "loss")}
            except Exception:
                return False
            return set(range(last + 1)) <= steps

        outage = _Outage(server, down=0, up=3, check=has_epochs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(
                x, y, epochs=6, batch_size=32, verbose=0, callbacks=[logger, outage]
            )
        assert len(history.history["loss"]) == 6  # training was never interrupted
        messages = [str(w.message) for w in caught]
        assert any("is not answering" in m and "buffered" in m for m in messages), messages
        assert outage.flushed_before_end
        assert logger.unsent == 0
        steps = [m.step for m in client.get_metric_history(logger.run_id, "loss")]
        assert steps == list(range(6))
        values = [m.value for m in client.get_metric_history(logger.run_id, "loss")]
        assert values == pytest.approx(history.history["loss"])

        # The same logger, another fit, and the server gone for good: training still completes
        # and the logger says plainly how many values never reached MLflow.
        server.stop()
        logger.flush_timeout = 2
        logger.step_offset = 6
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=[logger])
        assert len(history.history["loss"]) == 3
        # loss and accuracy of 3 epochs (the params went to this run in the first fit).
        assert logger.unsent == 3 * 2
        messages = [str(w.message) for w in caught]
        assert any(
            f"{logger.unsent} value(s) for run {logger.run_id} could not be sent" in m
            for m in messages
        ), messages
    finally:
        server.stop()
