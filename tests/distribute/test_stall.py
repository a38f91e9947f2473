"""A rank that waits in a collective longer than runtime.stall_timeout ends the job, named."""

from __future__ import annotations

import functools
import time

import pytest

from keras_dl.callbacks.stall import StallError, StallWatchdog
from keras_dl.errors import DistributedError
from keras_dl.launch import HorovodRunner
from tests.conftest import HEAVY
from tests.distribute.workers import fit_with_a_stalled_rank


def test_the_watchdog_names_the_open_section_once_it_outlasts_the_timeout():
    fired = []
    dog = StallWatchdog(timeout=1.5, exit=fired.append)
    dog.on_train_begin()
    dog.on_train_batch_begin(0)
    dog.on_train_batch_end(0)  # closed in time
    dog.on_epoch_end(0)
    time.sleep(3.2)
    dog.on_train_end()
    (error,) = fired
    assert isinstance(error, StallError)
    assert (
        "waited more than 1.5 s (runtime.stall_timeout) in the metric average at the end of epoch 1"
        in str(error)
    )


@pytest.mark.slow
@HEAVY
def test_a_rank_left_waiting_in_the_allreduce_ends_the_job_naming_it_and_the_step():
    start = time.monotonic()
    with pytest.raises(
        DistributedError,
        match=r"rank 0 failed: StallError: rank 0 waited more than 5 s \(runtime.stall_timeout\) "
        r"in the gradient allreduce of epoch 1, step 4",
    ):
        HorovodRunner(np=-2).run(functools.partial(fit_with_a_stalled_rank, timeout=5))
    elapsed = time.monotonic() - start
    print(f"the stalled job ended after {elapsed:.1f} s")
    assert elapsed < 120  # start-up included; rank 1 alone would sleep 600 s
