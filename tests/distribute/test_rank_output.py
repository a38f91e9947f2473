"""Horovod ranks on a Spark Connect session (a barrier stage): their output reaches the driver
while the stage runs, and ``start_timeout`` ends a stage whose tasks cannot start.

Both run on the suite's Connect server (local[2], in the session's JVM) with a trivial function
in place of a fit. The deadlines below only keep a broken launcher from hanging the suite.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keras_dl.errors import DistributedError
from keras_dl.launch import HorovodRunner
from tests.distribute.print_wait import MARKER, print_then_wait
from tests.distribute.slot_holder import hold_a_slot, in_thread, launch_with_a_slot_held

pytestmark = pytest.mark.connect_only


def _rank_zero() -> int:
    return 0


def test_a_rank_s_output_reaches_the_driver_while_the_stage_runs(spark, tmp_path, capsys):
    runner = HorovodRunner(np=1, start_timeout=60)
    thread, outcome = in_thread(lambda: runner.run(print_then_wait, folder=str(tmp_path)))
    seen = ""
    deadline = time.monotonic() + 90
    while f"[0]<stdout>:{MARKER}" not in seen and thread.is_alive():
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
        seen += capsys.readouterr().out
    (tmp_path / "go").touch()  # only now can the rank, and so the stage, end
    thread.join(180)
    assert f"[0]<stdout>:{MARKER}\n" in seen, "the rank's line came only after the stage ended"
    assert outcome == {"value": True}
    after = capsys.readouterr().out
    assert MARKER not in after  # printed once, not again when the stage's rows arrive


def test_ranks_that_find_no_free_slots_fail_after_start_timeout(spark, tmp_path: Path):
    # Another job holds one of the server's two task slots: a 2-rank barrier stage cannot
    # start (a Connect client does not see the free slots, only the configured two).
    holder = spark.range(0, 1, 1, 1).mapInPandas(hold_a_slot(str(tmp_path)), schema="id long")
    runner = HorovodRunner(np=2, start_timeout=5)
    alive, outcome, _ = launch_with_a_slot_held(
        holder.collect, tmp_path, lambda: runner.run(_rank_zero)
    )
    assert not alive, "the barrier stage waited for its slots beyond start_timeout"
    error = outcome.get("error")
    assert isinstance(error, DistributedError), outcome
    assert "did not all start within runtime.start_timeout=5 s" in str(error)
    assert "0 of the 2 Spark tasks" in str(error) and "raise runtime.start_timeout" in str(error)
    # The stage was cancelled: the session runs the next job with both slots.
    assert HorovodRunner(np=2, start_timeout=60).run(_rank_zero) == 0
