"""Learning rate scaled by the number of replicas, with an optional linear warmup.

``train.batch_size`` is the *global* batch in keras_dl, so the same config optimizes the same
way on 1 or N replicas with the learning rate unchanged (``runtime.lr_scaling=none``, the
default). The linear scaling rule (Goyal et al. 2017, Horovod's guidance) is for when the global
batch grows with the replicas: set ``runtime.lr_scaling=linear`` together with a batch size
N times larger, and usually ``runtime.warmup_epochs`` so the first steps are not taken at the
full, scaled rate.
"""

from __future__ import annotations

from typing import Any

import keras

SCALINGS = ("none", "linear")


def scale_learning_rate(learning_rate: Any, scaling: str, replicas: int, warmup_steps: int = 0):
    """Return the learning rate (a float or a schedule) for ``replicas`` replicas.

    Args:
        learning_rate: The base rate: a float or a Keras ``LearningRateSchedule``.
        scaling: "linear" (multiply by ``replicas``) or "none".
        replicas: Replicas that each see a slice of the global batch (Horovod ranks times
            devices per rank).
        warmup_steps: Ramp the multiplier linearly over this many optimizer steps. Defaults to 0.

    Returns:
        ``learning_rate`` unchanged when there is nothing to scale or warm up, else a
        :class:`WarmupScaled` schedule.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"lr scaling {scaling!r} is not one of {', '.join(SCALINGS)}")
    multiplier = float(replicas) if scaling == "linear" else 1.0
    if multiplier == 1.0 and warmup_steps <= 0:
        return learning_rate
    return WarmupScaled(learning_rate, multiplier, int(warmup_steps))


@keras.saving.register_keras_serializable(package="keras_dl")
class WarmupScaled(keras.optimizers.schedules.LearningRateSchedule):
    """``base(step) * multiplier``, ramped linearly in over the first ``warmup_steps`` steps.

    During warmup the factor goes from ``1/multiplier`` of the target (Goyal et al.: start at
    the single-replica rate) to the full target; with ``multiplier == 1`` it starts from
    ``1/warmup_steps`` instead (a plain linear warmup).

    Args:
        base: A float or a ``LearningRateSchedule`` evaluated at the same step.
        multiplier: The scale reached after warmup.
        warmup_steps: Steps of the ramp (0 for none). Defaults to 0.
    """

    def __init__(self, base, multiplier: float, warmup_steps: int = 0):
        self.base = base
        self.multiplier = float(multiplier)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        from keras import ops

        step = ops.cast(step, "float32")
        base = self.base(step) if callable(self.base) else ops.cast(self.base, "float32")
        if self.warmup_steps <= 0:
            return base * self.multiplier
        start = 1.0 / self.multiplier if self.multiplier > 1 else 1.0 / self.warmup_steps
        progress = ops.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        return base * self.multiplier * (start + (1.0 - start) * progress)

    def get_config(self):
        base = self.base
        if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
            base = keras.optimizers.schedules.serialize(base)
        return {"base": base, "multiplier": self.multiplier, "warmup_steps": self.warmup_steps}

    @classmethod
    def from_config(cls, config):
        base = config["base"]
        if isinstance(base, dict):
            base = keras.optimizers.schedules.deserialize(base)
        return cls(base, config["multiplier"], config["warmup_steps"])
