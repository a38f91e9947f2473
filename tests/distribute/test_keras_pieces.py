"""keras_dl's Horovod pieces in someone's own ``model.fit``, on 2 real local ranks."""

from __future__ import annotations

import functools

import pytest

from keras_dl.distribute.lr import WarmupScaled, scale_learning_rate
from keras_dl.launch import HorovodRunner
from tests.conftest import HEAVY
from tests.distribute.workers import own_model_fit


@pytest.mark.slow
@HEAVY
def test_broadcast_and_averaging_make_ranks_identical_with_fp16_and_warmup():
    ranks = HorovodRunner(np=-2).run(functools.partial(own_model_fit, fp16=True, warmup_steps=4))
    assert ranks[0]["initial"] != ranks[1]["initial"]  # different random starts...
    assert ranks[0]["final"] == ranks[1]["final"]  # ...the same model at the end
    assert ranks[0]["loss"] == ranks[1]["loss"]  # averaged epoch metrics
    # 256 rows / batch 32 = 8 steps per epoch, 2 epochs; warmup done: lr = 0.01 * 2 ranks.
    assert ranks[0]["iterations"] == 16
    assert ranks[0]["lr"] == pytest.approx(0.02)


def test_linear_scaling_and_warmup_schedule():
    assert scale_learning_rate(0.1, "none", 4) == 0.1
    sched = scale_learning_rate(0.1, "linear", 4, warmup_steps=10)
    assert isinstance(sched, WarmupScaled)
    assert float(sched(0)) == pytest.approx(0.1 * 4 * (0.25 + 0.75 * 0.1))  # starts near 0.1
    assert float(sched(9)) == pytest.approx(0.4)
    assert float(sched(1000)) == pytest.approx(0.4)
    again = WarmupScaled.from_config(sched.get_config())
    assert float(again(5)) == pytest.approx(float(sched(5)))
    with pytest.raises(ValueError, match="linear"):
        scale_learning_rate(0.1, "sqrt", 4)
