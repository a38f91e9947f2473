"""Divergence: find a NaN or infinite loss, metric or weight after training.

A diverged model must never be logged or registered: an alias flow would promote it. ``fit``
calls :func:`check_finite` after ``model.fit`` and again after test evaluation, and the run
ends FAILED with the reason as its ``keras_dl.failure`` tag.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from keras_dl.errors import DivergenceError

_FIX = (
    "Lower train.learning_rate (or use lr_schedule=cosine, warmup or gradient clipping) and "
    "check the table for NaN or infinite feature values."
)


def find_divergence(
    model=None, history: Mapping[str, Sequence] | None = None, metrics: Mapping | None = None
) -> str | None:
    """Say what is not finite, or return None when everything is.

    Args:
        model: A Keras model whose weights are checked. Defaults to None (not checked).
        history: ``History.history``: every loss-like value of every epoch. Defaults to None.
        metrics: Final metrics, e.g. ``{"test_loss": ...}``. Defaults to None.
    """
    for key, values in (history or {}).items():
        if "loss" not in key:
            continue  # a NaN AUC on one class-less batch is not a diverged model
        for epoch, value in enumerate(values):
            if _bad(value):
                return f"{key} is {float(value)} at epoch {epoch + 1}"
    for key, value in (metrics or {}).items():
        if _bad(value):
            return f"{key} is {float(value)}"
    if model is not None:
        for var in model.weights:
            if not np.all(np.isfinite(np.asarray(var.numpy(), dtype=np.float64))):
                return f"weight {var.path} holds NaN or infinite values"
    return None


def check_finite(model=None, history=None, metrics=None, learning_rate: float | None = None):
    """Raise :class:`~keras_dl.errors.DivergenceError` when :func:`find_divergence` finds any.

    Args:
        model: See :func:`find_divergence`. Defaults to None.
        history: See :func:`find_divergence`. Defaults to None.
        metrics: See :func:`find_divergence`. Defaults to None.
        learning_rate: The configured learning rate, named in the message. Defaults to None.
    """
    reason = find_divergence(model, history, metrics)
    if reason is None:
        return
    lr = f" (train.learning_rate={learning_rate:g})" if learning_rate is not None else ""
    raise DivergenceError(
        f"Training diverged: {reason}, not finite{lr}. The run is FAILED and no model was logged "
        f"or registered. {_FIX}"
    )


def _bad(value) -> bool:
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
