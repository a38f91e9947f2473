"""A classic Spark barrier stage collected under ``start_timeout``: cancelled, with the cause
named, when its tasks have not all started in time.

A barrier stage starts only when all its ``np`` task slots are free at once. The launcher checks
the free slots before it submits the stage, but another job can take them in between, and the
stage then waits for them with no end. So the stage is collected in a thread, in a job group of
its own, while this thread reads Spark's status tracker: once every task has started the wait
is over; past ``start_timeout`` with fewer started, the job group is cancelled and
:class:`~keras_dl.errors.DistributedError` says how many started. (On Spark Connect, where the
client cannot count running tasks, :func:`keras_dl.launch.rank_output.collect_watched` does
the same from the tasks' start markers.)
"""

from __future__ import annotations

import time
import uuid

from keras_dl.launch.rank_output import POLL_SECONDS, not_started

_CANCEL_SECONDS = 60.0  # how long a cancelled collect has to return


def collect_started(sc, rdd, np: int, start_timeout: float, who: str) -> list:
    """``rdd.collect()`` on ``sc``, its barrier stage's ``np`` tasks started within
    ``start_timeout`` seconds or the job cancelled.

    Args:
        who: What the tasks run, for the error ("multi-worker workers").

    Raises:
        DistributedError: Fewer than ``np`` tasks started in time (the job was cancelled).
        Whatever the collect raised, once the stage started.
    """
    from pyspark import InheritableThread

    group = f"keras_dl-stage-{uuid.uuid4().hex}"
    outcome: dict = {}

    def collect() -> None:
        sc.setJobGroup(group, f"keras_dl: {np} {who}", interruptOnCancel=True)
        try:
            outcome["rows"] = rdd.collect()
        except BaseException as exc:
            outcome["error"] = exc

    thread = InheritableThread(target=collect, daemon=True, name="keras_dl-stage-collect")
    deadline = time.monotonic() + start_timeout
    started = 0
    thread.start()
    try:
        while thread.is_alive():
            thread.join(POLL_SECONDS)
            if started < np:
                started = max(started, started_tasks(sc, group))
                if started < np and time.monotonic() >= deadline and thread.is_alive():
                    _cancel(sc, group, thread)
                    raise not_started(np, started, start_timeout, who, "MultiWorkerRunner")
    except KeyboardInterrupt:  # a notebook's stop button: the Spark job stops too
        _cancel(sc, group, thread)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rows"]


def started_tasks(sc, group: str) -> int:
    """The tasks of ``group``'s jobs that started (running, done or failed), on its busiest
    stage; 0 while the stage waits for its slots."""
    tracker = sc.statusTracker()
    most = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info is not None else ():
            s = tracker.getStageInfo(stage)
            if s is not None:
                most = max(most, s.numActiveTasks + s.numCompletedTasks + s.numFailedTasks)
    return most


def _cancel(sc, group: str, thread) -> None:
    sc.cancelJobGroup(group)
    thread.join(_CANCEL_SECONDS)
