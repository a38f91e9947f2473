"""MLflowLogger: per-epoch metrics (and params, and the model) to MLflow from any ``model.fit``.

Logging never kills training: MLflow calls run on a background thread, failures are warned
about once and the values stay buffered until the store answers again. At the end of training
the buffer is flushed; what still cannot be sent is reported with its count.

Example:
    >>> import keras, mlflow
    >>> logger = MLflowLogger(experiment="my-exp", params={"lr": 1e-3})   # doctest: +SKIP
    >>> model.fit(x, y, epochs=3, callbacks=[logger])                      # doctest: +SKIP
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

import keras

from keras_dl.distribute.world import current_world

log = logging.getLogger(__name__)


class MLflowLogger(keras.callbacks.Callback):
    """Log params and per-epoch metrics to an MLflow run, asynchronously, on rank 0 only.

    Args:
        run_id: Run to attach to. Defaults to the active run, or a new run.
        experiment: Experiment for a new run. Defaults to MLflow's default experiment.
        tracking_uri: Tracking URI for a new run. Defaults to MLflow's current URI.
        params: Params logged once at the start of training. Defaults to None.
        log_every_n_steps: Also log batch metrics every N steps (0 = epochs only). Defaults to 0.
        log_model: Log the model (with a signature from ``sample_input``) at the end.
            Defaults to False.
        sample_input: A small input batch for the model signature. Defaults to None.
        registered_model_name: Register the logged model under this name. Defaults to None.
        end_run: End a run this callback started when training ends. Defaults to True.
        flush_timeout: Seconds to wait for buffered values at the end. Defaults to 30.
    """

    def __init__(
        self,
        run_id: str | None = None,
        experiment: str | None = None,
        tracking_uri: str | None = None,
        params: Mapping[str, Any] | None = None,
        log_every_n_steps: int = 0,
        log_model: bool = False,
        sample_input: Any = None,
        registered_model_name: str | None = None,
        end_run: bool = True,
        flush_timeout: float = 30.0,
    ):
        super().__init__()
        self.run_id = run_id
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self.params = dict(params or {})
        self.log_every_n_steps = log_every_n_steps
        self.log_model = log_model
        self.sample_input = sample_input
        self.registered_model_name = registered_model_name
        self.end_run = end_run
        self.flush_timeout = flush_timeout
        self.step_offset = 0
        self.unsent = 0

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._active = current_world().is_chief
        self._queue: queue.Queue = queue.Queue()
        self._pending: list = []
        self._warned = False
        self._started_run = False
        self.unsent = 0
        self._global_step = 0
        if not self._active:
            return
        import mlflow

        if self.tracking_uri:
            mlflow.set_tracking_uri(self.tracking_uri)
        self._client = mlflow.MlflowClient()
        if self.run_id is None:
            active = mlflow.active_run()
            if active is not None:
                self.run_id = active.info.run_id
            else:
                exp_id = None
                if self.experiment:
                    exp = mlflow.get_experiment_by_name(self.experiment)
                    exp_id = exp.experiment_id if exp else mlflow.create_experiment(self.experiment)
                self.run_id = self._client.create_run(exp_id or "0").info.run_id
                self._started_run = True
        if self.params:
            self._submit("params", {k: str(v) for k, v in self.params.items()}, None)
        self._thread = threading.Thread(target=self._drain, name="MLflowLogger", daemon=True)
        self._thread.start()

    def on_train_batch_end(self, batch, logs=None):
        self._global_step += 1
        n = self.log_every_n_steps
        if self._active and n and self._global_step % n == 0 and logs:
            self._submit("metrics", _numbers(logs, prefix="step_"), self._global_step)

    def on_epoch_end(self, epoch, logs=None):
        if self._active and logs:
            self._submit("metrics", _numbers(logs), epoch + self.step_offset)

    def on_train_end(self, logs=None):
        if not self._active:
            return
        self._queue.put(None)
        self._thread.join(self.flush_timeout)
        self._flush_pending(final=True)
        if self.log_model and self.sample_input is not None:
            self._log_model()
        if self._started_run and self.end_run:
            self._safe(lambda: self._client.set_terminated(self.run_id, "FINISHED"))

    # -- internals ---------------------------------------------------------------------------
    def _submit(self, kind: str, values: dict, step: int | None) -> None:
        self._queue.put((kind, values, step, int(time.time() * 1000)))

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._pending.append(item)
            self._flush_pending(final=False)

    def _flush_pending(self, final: bool) -> None:
        from mlflow.entities import Metric, Param

        while self._pending:
            kind, values, step, ts = self._pending[0]
            if kind == "params":
                batch = dict(params=[Param(k, v) for k, v in values.items()])
            else:
                batch = dict(metrics=[Metric(k, v, ts, step) for k, v in values.items()])
            if not self._safe(lambda b=batch: self._client.log_batch(self.run_id, **b)):
                break
            self._pending.pop(0)
        if final and self._pending:
            self.unsent = sum(len(v) for _, v, _, _ in self._pending)
            warnings.warn(
                f"MLflowLogger: {self.unsent} value(s) for run {self.run_id} could not be sent "
                f"to MLflow at {self._client.tracking_uri}; they are lost for this run. "
                "Check that the tracking server is reachable.",
                stacklevel=2,
            )

    def _safe(self, fn) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # a logging failure must never stop training
            if not self._warned:
                warnings.warn(f"MLflowLogger: MLflow call failed ({exc}); buffering.", stacklevel=2)
                self._warned = True
            return False

    def _log_model(self) -> None:
        import mlflow

        from keras_dl.tracking import log_keras_model

        def log():
            with mlflow.start_run(run_id=self.run_id):
                log_keras_model(self.model, self.sample_input, self.registered_model_name)

        self._safe(log)


def _numbers(logs: Mapping, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        try:
            out[prefix + k] = float(v)
        except (TypeError, ValueError):
            continue
    return out
