"""Divergence: a NaN or infinite loss, metric or weight, or a training loss that blew up.

A diverged model must never be logged or registered: an alias flow would promote it. ``fit``
calls :func:`check_finite` after ``model.fit`` and again after test evaluation, and the run
ends FAILED with the reason as its ``keras_dl.failure`` tag. A loss that grows past
``callbacks.divergence_factor`` times its first epoch's value (:func:`loss_grew`) counts as
diverged too: ``EarlyStopping`` stops at that epoch's end, and the check here fails the run.
So does an epoch's loss more than ``callbacks.trivial_loss_factor`` times the trivial
predictor's loss on the training rows (:func:`above_trivial`, figures from
:mod:`keras_dl.trivial`): a start that explodes and then falls never grows past its first epoch.
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


def loss_grew(first: float, value: float, factor: float) -> bool:
    """Whether a training loss of ``value`` is more than ``factor`` times the ``first`` epoch's.

    Only for a positive, finite first loss and ``factor`` > 0 (0 disables the rule).
    """
    return factor > 0 and 0 < first < math.inf and value > factor * first


def above_trivial(value: float, trivial: float | None, factor: float) -> bool:
    """Whether a training loss of ``value`` is more than ``factor`` times the ``trivial``
    predictor's loss. Only for a known, positive, finite ``trivial`` and ``factor`` > 0."""
    return (
        factor > 0 and trivial is not None and 0 < trivial < math.inf and value > factor * trivial
    )


def find_divergence(
    model=None,
    history: Mapping[str, Sequence] | None = None,
    metrics: Mapping | None = None,
    factor: float = 0.0,
    trivial=None,
    trivial_factor: float = 0.0,
) -> str | None:
    """Say what is not finite or grew too far, or return None when nothing did.

    Args:
        model: A Keras model whose weights are checked. Defaults to None (not checked).
        history: ``History.history``: every loss-like value of every epoch. Defaults to None.
        metrics: Final metrics, e.g. ``{"test_loss": ...}``. Defaults to None.
        factor: ``history["loss"]`` may not grow past this many times its first epoch's value
            (the first epoch of this ``fit``: a resumed run counts from where it resumed).
            Defaults to 0.0 (not checked).
        trivial: The trivial predictor's training loss, a :class:`~keras_dl.trivial.TrivialLoss`
            (``value``, ``what``). Defaults to None (not checked).
        trivial_factor: No epoch's ``history["loss"]`` may be more than this many times
            ``trivial.value``. Defaults to 0.0 (not checked).
    """
    for key, values in (history or {}).items():
        if "loss" not in key:
            continue  # a NaN AUC on one class-less batch is not a diverged model
        for epoch, value in enumerate(values):
            if _bad(value):
                return f"{key} is {float(value)} at epoch {epoch + 1}, not finite"
    losses = [float(v) for v in (history or {}).get("loss", ())]
    for epoch, value in enumerate(losses):
        if loss_grew(losses[0], value, factor):
            return (
                f"loss grew from {losses[0]:.4g} in the first epoch to {value:.4g} at epoch "
                f"{epoch + 1}, more than callbacks.divergence_factor={factor:g} times"
            )
        if trivial is not None and above_trivial(value, trivial.value, trivial_factor):
            return trivial_message(value, epoch, trivial, trivial_factor)
    for key, value in (metrics or {}).items():
        if _bad(value):
            return f"{key} is {float(value)}, not finite"
    if model is not None:
        for var in model.weights:
            if not np.all(np.isfinite(np.asarray(var.numpy(), dtype=np.float64))):
                return f"weight {var.path} holds NaN or infinite values, not finite"
    return None


def trivial_message(value: float, epoch: int, trivial, factor: float) -> str:
    """Why a loss of ``value`` at ``epoch`` (from 0) is diverged against ``trivial``."""
    return (
        f"loss {value:.4g} at epoch {epoch + 1} is more than callbacks.trivial_loss_factor="
        f"{factor:g} times the trivial predictor's {trivial.value:.4g} on the training rows "
        f"({trivial.what})"
    )


def check_finite(
    model=None,
    history=None,
    metrics=None,
    learning_rate: float | None = None,
    factor: float = 0.0,
    trivial=None,
    trivial_factor: float = 0.0,
):
    """Raise :class:`~keras_dl.errors.DivergenceError` when :func:`find_divergence` finds any.

    Args:
        model: See :func:`find_divergence`. Defaults to None.
        history: See :func:`find_divergence`. Defaults to None.
        metrics: See :func:`find_divergence`. Defaults to None.
        learning_rate: The configured learning rate, named in the message. Defaults to None.
        factor: See :func:`find_divergence`. Defaults to 0.0 (no growth check).
        trivial: See :func:`find_divergence`. Defaults to None (no trivial-loss check).
        trivial_factor: See :func:`find_divergence`. Defaults to 0.0.
    """
    reason = find_divergence(model, history, metrics, factor, trivial, trivial_factor)
    if reason is None:
        return
    lr = f" (train.learning_rate={learning_rate:g})" if learning_rate is not None else ""
    raise DivergenceError(
        f"Training diverged: {reason}{lr}. The run is FAILED and no model was logged "
        f"or registered. {_FIX}"
    )


def _bad(value) -> bool:
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
