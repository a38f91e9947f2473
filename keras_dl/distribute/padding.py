"""Losses under which a padded batch trains as its real rows alone.

With several ranks every rank runs the same steps, and a rank with fewer rows pads its last batch
with copies of its rows at sample weight 0 (:func:`keras_dl.data.stream.blocks.weigh_and_pad`). Keras
3's default loss reduction, ``sum_over_batch_size``, divides ``sum(weight * loss)`` by every
slot of the batch, so those copies still count in the denominator: the real rows of a padded
batch of ``B`` slots with ``V`` real rows get ``V / B`` of the update one process gives them.

:func:`exclude_padding` wraps a compiled loss so that rows of weight 0 leave the denominator:
the loss of a batch is ``sum(weight * loss) / (rows of weight > 0)`` (per value of the row, as
Keras counts them). It does so by scaling the weights by ``slots / rows of weight > 0`` before
Keras' own reduction, so masks, dtypes and the per-replica scaling stay Keras'.

What that means for the user's weights (``data.weight_column``, ``train.class_weight``):
    * weights > 0 keep Keras' meaning: they scale a row's share against the rows of its batch,
      and a batch with no zero weight has exactly Keras' default loss;
    * a row of weight 0 counts as absent, padding or not (the batch's mean is over the others),
      as Keras treats a masked value.
Losses the recipe gives with another reduction are left alone: ``sum`` and
``mean_with_sample_weight`` already ignore weight-0 rows, and ``none`` is the recipe's to reduce.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

_DIVIDES_BY_SLOTS = ("sum_over_batch_size", "mean")  # Keras' default and its alias


@keras.saving.register_keras_serializable(package="keras_dl")
class RealRowsMean(keras.losses.Loss):
    """``loss``, divided by the rows of weight > 0 instead of every slot of the batch.

    Args:
        loss: A Keras loss: a name, a function ``fn(y_true, y_pred)`` or a ``Loss`` whose
            reduction is ``sum_over_batch_size``.
        name: Defaults to None: the inner loss' name.
    """

    def __init__(self, loss: Any, name: str | None = None, **kwargs):
        inner = keras.losses.get(loss)
        if not callable(inner):
            raise ValueError(f"{loss!r} is not a Keras loss (a name, function or Loss).")
        kwargs.pop("reduction", None)  # from a saved config: Keras' default, as below
        # A function reduces as Keras reduces one (its LossFunctionWrapper): through this Loss.
        is_loss = isinstance(inner, keras.losses.Loss)
        own = inner.name if is_loss else getattr(inner, "__name__", None)
        super().__init__(name=name or own, dtype=inner.dtype if is_loss else None, **kwargs)
        self.inner = inner
        self._reduce = inner if is_loss else super().__call__

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is None:
            return self._reduce(y_true, y_pred)
        weight = ops.convert_to_tensor(sample_weight, dtype=self.dtype)
        slots = ops.cast(ops.size(weight), weight.dtype)
        real = ops.sum(ops.cast(ops.greater(weight, 0), weight.dtype))
        # sum(w * s/r * loss) / s == sum(w * loss) / r; a batch of padding alone gives 0.
        return self._reduce(y_true, y_pred, weight * ops.divide_no_nan(slots, real))

    def call(self, y_true, y_pred):  # unweighted, unreduced: what Loss.call means
        if isinstance(self.inner, keras.losses.Loss):
            return self.inner.call(y_true, y_pred)
        return self.inner(y_true, y_pred)

    def get_config(self) -> dict:
        return {"name": self.name, "loss": keras.losses.serialize(self.inner)}

    @classmethod
    def from_config(cls, config: dict) -> RealRowsMean:
        config = dict(config)
        config["loss"] = keras.losses.deserialize(config["loss"])
        return cls(**config)


def exclude_padding(loss: Any) -> Any:
    """``loss`` as :class:`RealRowsMean` wherever it divides by the batch's slots.

    Args:
        loss: What a recipe gives ``model.compile(loss=...)``: a name, a function, a ``Loss``,
            or a list or dict of them (one per output head). None stays None.

    Returns:
        The same structure, each Keras-default loss wrapped; others unchanged.

    Raises:
        ValueError: An entry that is not a Keras loss, naming it.
    """
    if loss is None:
        return None
    if isinstance(loss, dict):
        return {head: exclude_padding(each) for head, each in loss.items()}
    if isinstance(loss, (list, tuple)):
        return type(loss)(exclude_padding(each) for each in loss)
    if isinstance(loss, RealRowsMean):
        return loss
    if isinstance(loss, keras.losses.Loss):
        return RealRowsMean(loss) if loss.reduction in _DIVIDES_BY_SLOTS else loss
    try:
        return RealRowsMean(loss)
    except ValueError as exc:
        raise ValueError(
            f"The recipe's loss {loss!r} is not a Keras loss name, function or Loss: {exc}"
        ) from None
