"""MLflowLogger: params, per-epoch metrics and the model to MLflow from any ``model.fit``.

Logging never kills training and never waits on the tracking store: values go to a queue that
a background thread sends. When the store is unreachable the thread warns once, keeps the
values buffered, and retries every few seconds (for an HTTP server it first checks the server's
``/health``, so a dead server costs no blocking retries); when the store answers again the
buffer is flushed in order, with the original timestamps and steps. At the end of training it
waits up to ``flush_timeout`` seconds for the buffer to empty, then reports plainly how many
values could not be sent (``unsent``).

Beside MLflow's autolog (``mlflow.tensorflow.autolog()`` or ``mlflow.keras.autolog()``), it logs
into the run autolog uses and leaves the epoch metrics to autolog, which logs every value of the
epoch's logs (those Throughput adds included) under the same names: each metric then has one
value per epoch, not two. Its own params (``fit.*``, ``optimizer.*``, ``keras.param_count``),
step metrics (``step_*``) and backfill are kept; their names differ from autolog's.

Example:
    >>> logger = MLflowLogger(experiment="my-exp", params={"lr": 1e-3}, log_model=True)  # doctest: +SKIP
    >>> model.fit(x, y, epochs=3, callbacks=[logger])                                   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import keras

from keras_dl.callbacks.mlflow_rest import is_reachable
from keras_dl.callbacks.mlflow_sender import MLflowSender
from keras_dl.distribute.world import current_world

log = logging.getLogger(__name__)


class MLflowLogger(keras.callbacks.Callback):
    """Log params and per-epoch metrics to an MLflow run, asynchronously, on rank 0 only.

    Args:
        run_id: Run to attach to. Defaults to the active run, or a new run.
        experiment: Experiment for a new run. Defaults to MLflow's default experiment.
        tracking_uri: Tracking URI. Defaults to MLflow's current URI.
        params: Params logged once at the start of training. Defaults to None.
        log_every_n_steps: Also log batch metrics every N steps, as ``step_<name>`` against the
            global step (0 = epochs only). Defaults to 0.
        log_model: Log the model with a signature at the end. Defaults to False.
        sample_input: A small input batch for the model signature. Defaults to None (a batch of
            zeros shaped like the model's inputs).
        registered_model_name: Register the logged model under this name. Defaults to None.
        end_run: End a run this callback started when training ends. Defaults to True.
        flush_timeout: Seconds to wait for buffered values at the end. Defaults to 30.
        retry_interval: Seconds between attempts while the store is unreachable. Defaults to 2.
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
        retry_interval: float = 2.0,
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
        self.retry_interval = retry_interval
        self.step_offset = 0  # added to epoch indices, for fit calls that restart at epoch 0
        # {"epoch": e, "logs": {...}}: an epoch a resumed checkpoint finished, logged at the
        # start if the run lacks it (the process was killed before sending it).
        self.backfill: dict | None = None
        self.unsent = 0
        self._params_sent_to: str | None = None
        self._fit_params: dict = {}
        # A batch-end hook only with step logging: on backends that dispatch batch-end
        # callbacks asynchronously (JAX), any synchronous one turns that off.
        if log_every_n_steps:
            self.on_train_batch_end = self._log_step

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._active = current_world().is_chief
        self._started_run = False
        self._sender = None
        self.unsent = 0
        if not self._active:
            return
        self._autologged = autolog_logs_epochs()
        # Steps continue from the optimizer's counter, so a resumed run adds no duplicates.
        self._global_step = (
            int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            if self.model.optimizer
            else 0
        )
        import mlflow

        uri = self.tracking_uri or mlflow.get_tracking_uri()
        self._client = mlflow.MlflowClient(uri)
        self._uri = uri
        if self.run_id is None and mlflow.active_run() is not None:
            self.run_id = mlflow.active_run().info.run_id
        self._sender = MLflowSender(
            self._client, uri, self.run_id, self._create_run, self.retry_interval
        )
        if self.run_id is None:
            # Created now when the store answers; otherwise later by the sending thread,
            # so an unreachable server delays the run instead of failing ``fit``.
            self._started_run = True
            self._sender.try_create_run()
            self.run_id = self._sender.run_id
        if self._params_sent_to is None or self._params_sent_to != self.run_id:
            self._params_sent_to = self.run_id or "new"  # once per run: a second fit may differ
            params = {**self._model_params(), **self.params}
            self._submit("params", {k: str(v)[:6000] for k, v in params.items()}, None)
        if self.run_id is not None:
            self._submit_backfill()
        self._sender.start()

    def _log_step(self, batch, logs=None):
        if not self._active:
            return
        self._global_step += 1
        n = self.log_every_n_steps
        if n and self._global_step % n == 0 and logs:
            self._submit("metrics", _numbers(logs, prefix="step_"), self._global_step)

    def on_epoch_end(self, epoch, logs=None):
        if self._active and logs and not self._autologged:
            self._submit("metrics", _numbers(logs), epoch + self.step_offset)

    def on_train_end(self, logs=None):
        if not self._active:
            return
        self.flush()
        if self.run_id is None:
            return  # the run could never be created: reported above
        if self.log_model:
            self._log_model()
        if self._started_run and self.end_run:
            self._call(lambda: self._client.set_terminated(self.run_id, "FINISHED"))

    def flush(self, stopped: bool = False) -> None:
        """Send what is queued (waiting up to ``flush_timeout``) and stop the sending thread.

        ``on_train_end`` calls it; call it yourself when ``fit`` raises, so the values of the
        steps and epochs before the error still reach the run. Idempotent.

        Args:
            stopped: Training has stopped on an error (``fit`` raised). A tracking server that
                then fails its ``/health`` check gets one last attempt instead of the
                ``flush_timeout`` wait, which would only hold the job's end (a host cut off the
                server, say); a resumed run logs again the epoch its checkpoint holds.
        """
        sender = getattr(self, "_sender", None)
        if not getattr(self, "_active", False) or sender is None or not sender.running:
            return
        wait = self.flush_timeout
        if stopped and not is_reachable(self._uri)[0]:
            wait = 0.0
        self.unsent = sender.close(wait)
        if self.run_id is None and sender.run_id is not None:  # created by the thread
            self.run_id = self._params_sent_to = sender.run_id
        if self.unsent and wait == 0.0:
            warnings.warn(
                f"MLflowLogger: training stopped and MLflow at {self._uri} is not answering: "
                f"{self.unsent} value(s) for run {self.run_id} could not be sent; they are not "
                "in the run (a resumed run logs again the epoch its checkpoint holds).",
                stacklevel=2,
            )
        elif self.unsent:
            warnings.warn(
                f"MLflowLogger: {self.unsent} value(s) for run {self.run_id} could not be sent "
                f"to MLflow at {self._uri} within {self.flush_timeout:.0f} s; they are not in "
                "the run. Check that the tracking server is reachable.",
                stacklevel=2,
            )

    def log_metrics(
        self, values: Mapping[str, float], step: int, timestamp_ms: int | None = None
    ) -> bool:
        """Queue metrics for this run from any thread (rank 0; e.g. the system-metrics sampler).

        Returns:
            False when nothing was queued: not rank 0, or the sending thread is not running
            (before ``fit`` or after its end).
        """
        sender = getattr(self, "_sender", None)
        if not getattr(self, "_active", False) or sender is None or not sender.running:
            return False
        sender.submit("metrics", dict(values), step, timestamp_ms)
        return True

    @property
    def dropped(self) -> int:
        """Values the store rejected in this ``fit`` (not retried)."""
        sender = getattr(self, "_sender", None)
        return sender.dropped if sender is not None else 0

    def _submit_backfill(self) -> None:
        if not self.backfill or not self.backfill.get("logs"):
            return
        epoch, values = self.backfill["epoch"] + self.step_offset, self.backfill["logs"]
        self.backfill = None
        key = next(iter(values))
        try:
            logged = {m.step for m in self._client.get_metric_history(self.run_id, key)}
        except Exception as exc:  # unknown: better a gap reported than a duplicate step
            log.warning(
                "MLflowLogger: cannot check epoch %d of run %s (%s).", epoch, self.run_id, exc
            )
            return
        if epoch not in logged:
            self._submit("metrics", values, epoch)

    # -- sending -----------------------------------------------------------------------------
    def _submit(self, kind: str, values: dict, step: int | None) -> None:
        self._sender.submit(kind, values, step)

    def _call(self, fn) -> bool:
        return self._sender.call(fn)

    # -- helpers -----------------------------------------------------------------------------
    def _create_run(self) -> str:
        exp_id = "0"
        if self.experiment:
            exp = self._client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp else self._client.create_experiment(self.experiment)
        return self._client.create_run(exp_id).info.run_id

    def _model_params(self) -> dict[str, Any]:
        """What fit knows: epochs, steps, the optimizer and its learning rate, the model size."""
        fit = self._fit_params
        out: dict[str, Any] = {
            "fit.epochs": fit.get("epochs"),
            "fit.steps_per_epoch": fit.get("steps"),
        }
        opt = self.model.optimizer
        if opt is not None:
            out["optimizer.name"] = type(opt).__name__
            lr = getattr(opt, "_learning_rate", None)
            out["optimizer.learning_rate"] = (
                float(lr.numpy()) if hasattr(lr, "numpy") else type(lr).__name__
            )
        out["keras.param_count"] = self.model.count_params()
        return {k: v for k, v in out.items() if v is not None}

    def set_params(self, params):
        # Keras would store fit's params on ``self.params``: here those are the MLflow params.
        self._fit_params = dict(params or {})

    def _log_model(self) -> None:
        import mlflow

        from keras_dl.model.publish import log_keras_model

        sample = (
            self.sample_input if self.sample_input is not None else _zeros_like_inputs(self.model)
        )

        def log():
            active = mlflow.active_run()
            if active is not None and active.info.run_id == self.run_id:
                log_keras_model(self.model, sample, self.registered_model_name)
                return
            with mlflow.start_run(run_id=self.run_id):
                log_keras_model(self.model, sample, self.registered_model_name)
            if not (self._started_run and self.end_run):  # the with-block ended it: reopen
                self._client.update_run(self.run_id, status="RUNNING")

        if not self._call(log):
            log.warning("MLflowLogger: the model could not be logged to run %s.", self.run_id)


def autolog_logs_epochs() -> bool:
    """True when MLflow's TensorFlow or Keras autolog is on: it logs each epoch's logs itself."""
    try:
        from mlflow.utils.autologging_utils import autologging_is_disabled
    except ImportError:  # an MLflow without it: log as usual
        return False
    return any(not autologging_is_disabled(flavor) for flavor in ("tensorflow", "keras"))


def _zeros_like_inputs(model):
    import numpy as np

    def zeros(t):
        return np.zeros((1, *[d or 1 for d in t.shape[1:]]), dtype=t.dtype or "float32")

    inputs = model.inputs
    if isinstance(inputs, dict):
        return {k: zeros(v) for k, v in inputs.items()}
    return zeros(inputs[0]) if len(inputs) == 1 else [zeros(t) for t in inputs]


def _numbers(logs: Mapping, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        try:
            out[prefix + k] = float(v)
        except (TypeError, ValueError):
            continue
    return out
