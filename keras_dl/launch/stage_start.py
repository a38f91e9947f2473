"""A Spark barrier stage collected under ``start_timeout``: cancelled, with the cause named,
when its tasks have not all started in time.

A barrier stage starts only when all its ``np`` task slots are free at once. The launcher checks
the free slots before it submits the stage, but another job can take them in between, and the
stage then waits for them with no end. So the stage is collected in a thread while this thread
counts its started tasks (:func:`collect_within`): once every task has started the wait is
over; past ``start_timeout`` with fewer started, the job is cancelled and
:class:`~keras_dl.errors.DistributedError` says how many started. A classic session counts
them with Spark's status tracker (:func:`collect_started`: the multi-worker strategy's stage);
a Spark Connect client, which cannot, from the tasks' start markers
(:func:`keras_dl.launch.rank_output.collect_watched`: Horovod's).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from keras_dl.errors import DistributedError

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the driver looks at the stage
_CANCEL_SECONDS = 60.0  # how long a cancelled collect has to return


def collect_within(
    collect: Callable[[], list],
    started: Callable[[], int],
    cancel: Callable[[], None],
    np: int,
    start_timeout: float,
    error: Callable[[int], DistributedError],
    *,
    thread_type=threading.Thread,
    tick: Callable[[], None] = lambda: None,
) -> list:
    """``collect()`` in a thread of ``thread_type``, its ``np`` tasks started within
    ``start_timeout`` seconds or the job cancelled.

    Args:
        collect: Collects the stage (in the thread: it sets the job's tag or group there).
        started: The stage's tasks started so far.
        cancel: Cancels the job (its tag or group).
        error: The error for ``started`` tasks of ``np`` started in time.
        tick: Called at every look, and once after the stage ended (printing the output).

    Raises:
        DistributedError: ``error(started)``, after the job was cancelled.
        Whatever the collect raised, once the stage started.
    """
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["rows"] = collect()
        except BaseException as exc:
            outcome["error"] = exc

    thread = thread_type(target=target, daemon=True, name="keras_dl-stage-collect")
    deadline = time.monotonic() + start_timeout
    count = 0
    thread.start()
    try:
        while thread.is_alive():
            thread.join(POLL_SECONDS)
            tick()
            if count < np:
                count = max(count, started())
                if count < np and time.monotonic() >= deadline and thread.is_alive():
                    _cancel(cancel, thread)
                    raise error(count)
    except KeyboardInterrupt:  # a notebook's stop button: the Spark job stops too
        _cancel(cancel, thread)
        raise
    tick()  # what was written after the last look
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rows"]


def collect_started(sc, rdd, np: int, start_timeout: float, who: str) -> list:
    """``rdd.collect()`` on the classic ``sc``, its barrier stage's ``np`` tasks started within
    ``start_timeout`` seconds (counted by Spark's status tracker) or the job cancelled.

    Args:
        who: What the tasks run, for the error ("multi-worker workers").
    """
    from pyspark import InheritableThread

    group = f"keras_dl-stage-{uuid.uuid4().hex}"

    def collect() -> list:
        sc.setJobGroup(group, f"keras_dl: {np} {who}", interruptOnCancel=True)
        return rdd.collect()

    return collect_within(
        collect,
        lambda: started_tasks(sc, group),
        lambda: sc.cancelJobGroup(group),
        np,
        start_timeout,
        lambda count: not_started(np, count, start_timeout, who, "MultiWorkerRunner"),
        thread_type=InheritableThread,
    )


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


def not_started(
    np: int, started: int, start_timeout: float, who: str, runner: str
) -> DistributedError:
    """The error of a barrier stage whose ``np`` tasks (running ``who``, launched by
    ``runner``) did not all start."""
    return DistributedError(
        f"The {who} did not all start within runtime.start_timeout={start_timeout:g} s "
        f"({runner}'s start_timeout): {started} of the {np} Spark tasks of the barrier "
        f"stage started, and a barrier stage starts only when {np} task slots are free at once. "
        "The Spark job was cancelled. Free task slots (wait for the cluster's running jobs, or "
        "add executors or cores), use a smaller runtime.np, or raise runtime.start_timeout."
    )


def _cancel(cancel: Callable[[], None], thread) -> None:
    try:
        cancel()
    except Exception as exc:
        log.warning("could not cancel the Spark job of the barrier stage: %s", exc)
    thread.join(_CANCEL_SECONDS)
