"""EarlyStopping: Keras' patience rule plus stopping and divergence thresholds, a NaN guard and a
guard against a training loss that blows up.

Why training stopped, and at which epoch, is printed and (on rank 0, when an MLflow run is
active or given) logged: the param ``early_stopping.reason`` and the metrics
``early_stopping.stopped_epoch`` and ``early_stopping.best``.

Example:
    >>> stop = EarlyStopping(monitor="val_loss", stopping_threshold=0.55, patience=5)  # doctest: +SKIP
    >>> model.fit(x, y, validation_split=0.2, epochs=50, callbacks=[stop])            # doctest: +SKIP
    >>> stop.stop_reason, stop.stopped_epoch                                          # doctest: +SKIP
    ('stopping_threshold', 7)
"""

from __future__ import annotations

import logging
import math

import keras
import numpy as np

from keras_dl import tracking
from keras_dl.distribute.world import current_world
from keras_dl.divergence import above_trivial, loss_grew, trivial_message

log = logging.getLogger(__name__)

MAX_WORDS = ("acc", "auc", "precision", "recall", "f1", "iou")


class EarlyStopping(keras.callbacks.Callback):
    """Stop when ``monitor`` stops improving, crosses a threshold, or a value is not finite.

    Args:
        monitor: Epoch metric to watch. Defaults to "val_loss".
        mode: "min", "max" or "auto" (max for accuracy, AUC, precision, recall, F1 and IoU
            names, else min). Defaults to "auto".
        min_delta: Smallest change that counts as an improvement. Defaults to 0.0.
        patience: Stop after this many epochs in a row without improvement (as Keras);
            None disables the patience rule. Defaults to None.
        stopping_threshold: Stop as soon as ``monitor`` is better than this (for example
            val_loss < 0.55). Defaults to None.
        divergence_threshold: Stop as soon as ``monitor`` is worse than this. Defaults to None.
        check_finite: Stop at the first step whose loss is NaN or infinite, and at the first
            epoch whose ``monitor`` is. Defaults to True.
        divergence_factor: Stop (reason "diverged") at the end of the first epoch whose
            training ``loss`` is more than this many times the first epoch's (of this ``fit``);
            0 disables it. Under Horovod the epoch's loss is the ranks' average
            (``MetricAverage`` runs first), so every rank stops at the same epoch.
            Defaults to 10.0.
        trivial_loss: The trivial predictor's loss on the training rows, a
            :class:`~keras_dl.trivial.TrivialLoss`: stop (reason "diverged") at the end of the
            first epoch whose training ``loss`` is more than ``trivial_loss_factor`` times it.
            Defaults to None (not checked).
        trivial_loss_factor: See ``trivial_loss``; 0 disables it. Defaults to 100.0.
        restore_best_weights: When stopping, restore the weights of the best epoch.
            Defaults to False.
        run_id: MLflow run to log the reason to. Defaults to the active run, if any.
        verbose: Print why training stopped. Defaults to True.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        mode: str = "auto",
        min_delta: float = 0.0,
        patience: int | None = None,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_finite: bool = True,
        divergence_factor: float = 10.0,
        trivial_loss=None,
        trivial_loss_factor: float = 100.0,
        restore_best_weights: bool = False,
        run_id: str | None = None,
        verbose: bool = True,
    ):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"EarlyStopping mode={mode!r} is not one of auto, min, max.")
        self.monitor = monitor
        if mode == "auto":
            mode = "max" if any(w in monitor.lower() for w in MAX_WORDS) else "min"
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_finite = check_finite
        self.divergence_factor = divergence_factor
        self.trivial_loss = trivial_loss
        self.trivial_loss_factor = trivial_loss_factor
        self.restore_best_weights = restore_best_weights
        self.run_id = run_id
        self.verbose = verbose
        if check_finite:
            self.on_train_batch_end = self._check_step
            self.async_safe = True

    def on_train_begin(self, logs=None):
        self.wait = 0
        self.best = math.inf if self.mode == "min" else -math.inf
        self.best_epoch: int | None = None
        self.best_weights = None
        self.stop_reason = "completed"
        self.stop_message = ""
        self.stopped_epoch: int | None = None
        self._epoch = 0
        self._first_loss: float | None = None
        self._missing_warned = False
        self._world_size = current_world().size

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def _check_step(self, batch, logs=None):
        """``on_train_batch_end`` when ``check_finite``. Marked ``async_safe``: it only reads the
        logs and sets ``stop_training``, so backends that dispatch batch-end callbacks
        asynchronously (JAX) may keep doing so."""
        if self._world_size > 1 or not logs or "loss" not in logs:
            return  # across ranks, only the (averaged) epoch values decide, or ranks would hang
        loss = float(logs["loss"])
        if not math.isfinite(loss):
            self._stop(
                "non_finite",
                f"loss is {loss} at epoch {self._epoch + 1}, step {batch + 1}: "
                "stopping training (lower the learning rate, check the input for NaN/inf "
                "values, or enable gradient clipping).",
            )

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training and self.stop_reason == "non_finite":
            return  # already stopped inside this epoch
        if self._loss_grew(epoch, logs or {}):
            return
        value = (logs or {}).get(self.monitor)
        if value is None:
            if self._missing_warned:
                return
            self._missing_warned = True
            log.warning(
                "EarlyStopping: %r is not among the epoch's metrics (%s).",
                self.monitor,
                ", ".join(sorted(logs or {})),
            )
            return
        value = float(value)
        if not math.isfinite(value):
            if self.check_finite:
                self._stop("non_finite", f"{self.monitor} is {value} at epoch {epoch + 1}.")
            return
        if self._better(value, self.best, self.min_delta):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
        else:
            self.wait += 1
        if self.stopping_threshold is not None and self._better(
            value, self.stopping_threshold, 0.0
        ):
            self._stop(
                "stopping_threshold",
                f"{self.monitor}={value:.6g} passed the stopping threshold "
                f"{self.stopping_threshold} at epoch {epoch + 1}.",
            )
        elif self.divergence_threshold is not None and self._better(
            self.divergence_threshold, value, 0.0
        ):
            self._stop(
                "divergence_threshold",
                f"{self.monitor}={value:.6g} is worse than the divergence threshold "
                f"{self.divergence_threshold} at epoch {epoch + 1}.",
            )
        elif self.patience is not None and self.wait >= self.patience and self.wait:
            self._stop(
                "patience",
                f"{self.monitor} did not improve by more than {self.min_delta} for "
                f"{self.wait} epoch(s) (patience {self.patience}); best "
                f"{self.best:.6g} at epoch {self.best_epoch + 1}, stopped at epoch {epoch + 1}.",
            )

    def on_train_end(self, logs=None):
        if self.stopped_epoch is not None and self.restore_best_weights:
            if self.best_weights is not None and self.best_epoch != self.stopped_epoch:
                self.model.set_weights(self.best_weights)
                if self.verbose:
                    print(f"EarlyStopping: restored the weights of epoch {self.best_epoch + 1}.")
        if not current_world().is_chief:
            return
        if self.verbose and self.stopped_epoch is not None:
            print(f"EarlyStopping: {self.stop_message}")
        self._log_to_mlflow()

    # -- internals ---------------------------------------------------------------------------
    def _better(self, a: float, b: float, delta: float) -> bool:
        return a < b - delta if self.mode == "min" else a > b + delta

    def _loss_grew(self, epoch: int, logs) -> bool:
        """Stop when the epoch's training loss grew past ``divergence_factor`` times the first's,
        or is more than ``trivial_loss_factor`` times the trivial predictor's."""
        try:
            loss = float(logs["loss"])
        except (KeyError, TypeError, ValueError):
            return False
        trivial = self.trivial_loss
        if trivial is not None and above_trivial(loss, trivial.value, self.trivial_loss_factor):
            reason = trivial_message(loss, epoch, trivial, self.trivial_loss_factor)
            self._stop("diverged", f"{reason}: stopping training (lower the learning rate).")
            return True
        if self._first_loss is None:
            self._first_loss = loss
            return False
        if not loss_grew(self._first_loss, loss, self.divergence_factor):
            return False
        self._stop(
            "diverged",
            f"loss grew from {self._first_loss:.4g} in the first epoch to {loss:.4g} at epoch "
            f"{epoch + 1}, more than {self.divergence_factor:g} times: stopping training (lower "
            "the learning rate or enable gradient clipping).",
        )
        return True

    def _stop(self, reason: str, message: str) -> None:
        self.model.stop_training = True
        if self.stopped_epoch is None:  # the first reason is the one that counts
            self.stop_reason, self.stop_message, self.stopped_epoch = reason, message, self._epoch
            log.warning("EarlyStopping: %s", message)

    def _log_to_mlflow(self) -> None:
        """Log the reason and epoch; failures warn (logging must never kill training)."""
        try:
            run_id = self.run_id or tracking.active_run_id()
            if run_id is None:
                return
            client = tracking.client()
            metrics = {}
            if self.stopped_epoch is not None:
                metrics["early_stopping.stopped_epoch"] = self.stopped_epoch
            if self.best_epoch is not None and np.isfinite(self.best):
                metrics["early_stopping.best"] = self.best
                metrics["early_stopping.best_epoch"] = self.best_epoch
            for key, value in metrics.items():
                client.log_metric(run_id, key, float(value))
            client.log_param(run_id, "early_stopping.reason", self.stop_reason)
        except Exception as exc:
            log.warning("EarlyStopping: could not log the stop reason to MLflow (%s).", exc)
