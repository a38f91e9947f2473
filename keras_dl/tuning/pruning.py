"""OptunaPruning: report each epoch's validation metric to an Optuna trial, stop when pruned.

Usable in anyone's ``model.fit``::

    >>> cb = OptunaPruning(trial, monitor="val_loss")                     # doctest: +SKIP
    >>> model.fit(x, y, validation_split=0.2, epochs=20, callbacks=[cb])  # doctest: +SKIP
    >>> cb.pruned_epoch                                                   # doctest: +SKIP
    3

Pruning stops training (``model.stop_training``) rather than raising, so the run still ends
cleanly: its metrics so far are logged and :func:`keras_dl.tuning.trial.run_trial` marks the
trial PRUNED.
"""

from __future__ import annotations

import logging
import math

import keras

from keras_dl.callbacks.early_stopping import MAX_WORDS

log = logging.getLogger(__name__)


class OptunaPruning(keras.callbacks.Callback):
    """Report ``monitor`` to ``trial`` after each epoch; stop training when Optuna prunes it.

    Args:
        trial: An ``optuna.Trial``.
        monitor: The metric in the epoch's logs, e.g. "val_loss". Defaults to "val_loss".
        prune: Stop when the trial's pruner says so; False only reports. Defaults to True.
    """

    def __init__(self, trial, monitor: str = "val_loss", prune: bool = True):
        super().__init__()
        self.trial = trial
        self.monitor = monitor
        self.prune = prune
        self.pruned_epoch: int | None = None
        self.last_value: float | None = None

    def on_train_begin(self, logs=None):
        self.pruned_epoch = None
        self.last_value = None

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            raise ValueError(
                f"OptunaPruning: the epoch's logs have no {self.monitor!r} (they have "
                f"{', '.join(sorted(logs or {}))}). Set tune.metric to one of them; a val_ metric "
                "needs a validation split."
            )
        value = float(value)
        self.last_value = value
        if not math.isfinite(value):
            return  # Optuna's median pruner ignores NaN; the divergence check fails the trial
        self.trial.report(value, epoch)
        if self.prune and self.trial.should_prune():
            log.warning(
                "Trial %d pruned after epoch %d (%s=%.4g).",
                self.trial.number,
                epoch + 1,
                self.monitor,
                value,
            )
            self.pruned_epoch = epoch
            self.model.stop_training = True


def direction_of(metric: str, direction: str = "auto") -> str:
    """ "minimize" or "maximize" for ``metric``: ``direction`` unless "auto", then maximize for
    accuracy-like names (as early stopping's mode "auto")."""
    if direction != "auto":
        return direction
    return "maximize" if any(w in metric.lower() for w in MAX_WORDS) else "minimize"
