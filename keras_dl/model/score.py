"""The metric the registry gate compares, and how one score beats another.

The task comes from the compiled metrics and loss: an accuracy metric means classification, an
MSE or RMSE metric (or a mean-squared-error loss) regression; else the loss is compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

TIE_TOLERANCE = 1e-6  # relative: float32 metrics carry about 7 significant digits

ACCURACY = (
    "accuracy",
    "acc",
    "sparse_categorical_accuracy",
    "categorical_accuracy",
    "binary_accuracy",
)
MSE = ("mse", "mean_squared_error")
RMSE = ("rmse", "root_mean_squared_error")


@dataclass(frozen=True)
class Score:
    """The metric the gate compares: its name, value, direction and the task it implies."""

    name: str
    value: float
    higher_is_better: bool
    task: str | None  # "classification", "regression", or None (the loss of another task)

    def beats(self, other: float) -> bool:
        """Strictly better than ``other``. Keras reports metrics in float32, so a score within
        float32 rounding of ``other`` ties, and a tie does not beat: a model that collapsed to
        the majority class scores 37/360 as 0.10277778, above the exact 0.10277777..."""
        if math.isclose(self.value, other, rel_tol=TIE_TOLERANCE):
            return False
        return self.value > other if self.higher_is_better else self.value < other

    def no_worse(self, other: float, tolerance: float) -> bool:
        """Worse than ``other`` by at most ``tolerance`` times ``other`` (a float32 tie is no
        worse)."""
        if math.isclose(self.value, other, rel_tol=TIE_TOLERANCE):
            return True
        slack = abs(other) * tolerance
        return self.value >= other - slack if self.higher_is_better else self.value <= other + slack


def main_score(
    model, scores: Mapping[str, float], prefix: str, head: str | None = None
) -> Score | None:
    """The metric the gate compares: accuracy (classification), MSE (regression), else the loss.

    Args:
        model: The compiled model (its loss tells a mean-squared-error regression apart).
        scores: One split's metrics, each named ``prefix`` + the compiled name.
        prefix: "test_" or "val_" (with the head's label for several heads: "test_price_").
        head: The output head (label) whose loss to look at, for several heads. Defaults to
            None (one output).
    """
    for name in ACCURACY:
        if prefix + name in scores:
            return Score(prefix + name, scores[prefix + name], True, "classification")
    for name in MSE:
        if prefix + name in scores:
            return Score(prefix + name, scores[prefix + name], False, "regression")
    for name in RMSE:
        if prefix + name in scores:
            value = scores[prefix + name] ** 2
            return Score(f"{prefix}{name}^2", value, False, "regression")
    if prefix + "loss" not in scores:
        return None
    loss = getattr(model, "loss", None)
    if head is not None and isinstance(loss, Mapping):
        loss = loss.get(head)
    if loss in MSE or type(loss).__name__ == "MeanSquaredError":
        return Score(f"{prefix}loss (MSE)", scores[prefix + "loss"], False, "regression")
    return Score(prefix + "loss", scores[prefix + "loss"], False, None)


def head_prefix(prefix: str, head: str | None) -> str:
    """Keras names a head's metrics after its output: ``val_`` + ``price_`` + ``mae``."""
    return f"{prefix}{head}_" if head else prefix
