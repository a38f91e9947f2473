"""Horovod with np=-2 on this host: real Gloo processes training the digits recipe."""

from __future__ import annotations

import threading

import pytest

from keras_dl.distribute.runner import HorovodRunner, launch
from keras_dl.errors import DistributedError
from keras_dl.train import fit
from tests.distribute.checks import check_horovod_run
from tests.distribute.workers import train_and_report


@pytest.mark.slow
def test_two_local_ranks_train_like_one_process(digits_exp, tmp_path):
    exp = digits_exp("runtime.strategy=horovod", "runtime.np=-2")
    report = launch(exp, main=train_and_report)
    check_horovod_run(report, exp)

    # The same global batch in one process reaches about the same accuracy.
    single = fit(
        digits_exp(
            "runtime.strategy=none",
            f"tracking.uri=sqlite:///{tmp_path / 'single.db'}",
            "tracking.log_model=false",
        )
    )
    horovod_acc = report["result"].metrics["test_accuracy"]
    assert horovod_acc > 0.85
    assert abs(horovod_acc - single.metrics["test_accuracy"]) < 0.05


def test_runner_returns_rank_zero_result():
    def main(offset):
        import horovod.tensorflow as hvd

        hvd.init()
        return hvd.rank() + offset, hvd.size()

    assert HorovodRunner(np=-2).run(main, offset=10) == (10, 2)


def test_unpicklable_function_is_a_clear_error():
    lock = threading.Lock()

    def main():
        with lock:
            return 1

    with pytest.raises(DistributedError, match=r"main.*cannot be pickled.*inside its body"):
        HorovodRunner(np=-2).run(main)
