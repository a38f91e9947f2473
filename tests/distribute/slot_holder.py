"""A launcher run while another job holds one of the session's two task slots, for the
``start_timeout`` tests (Horovod on Spark Connect: test_rank_output; the multi-worker strategy
on a classic session: test_stage_start)."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def in_thread(call) -> tuple[threading.Thread, dict]:
    """``call()`` in a daemon thread; the dict gets its ``value`` or its ``error``."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def hold_a_slot(folder: str):
    """A Spark task body (``mapPartitions`` or ``mapInPandas``) that says it runs, then holds
    its task slot until ``folder/release`` exists (300 s at most)."""

    def hold(batches):
        import os
        import time

        for _ in batches:
            pass
        open(os.path.join(folder, "holding"), "w").close()
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
            time.sleep(0.2)
        yield from ()

    return hold


def launch_with_a_slot_held(hold_job, folder: Path, launch) -> tuple[bool, dict, float]:
    """Run ``launch()`` while ``hold_job()`` (a collect whose one task runs
    :func:`hold_a_slot`) holds a slot: whether ``launch`` still ran after 90 s (a launcher
    without the timeout waits for the slot), its outcome, and the seconds it took."""
    other, _ = in_thread(hold_job)
    try:
        deadline = time.monotonic() + 120
        while not (folder / "holding").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (folder / "holding").exists(), "the slot-holding task did not start"
        began = time.monotonic()
        thread, outcome = in_thread(launch)
        thread.join(90)
        alive, waited = thread.is_alive(), time.monotonic() - began
    finally:
        (folder / "release").touch()
    other.join(120)
    return alive, outcome, waited
