"""Free Spark task slots: check them before asking Horovod for ``np`` tasks.

``horovod.spark.run`` waits up to its start timeout (600 s by default) for all ``np`` tasks to
start; on a cluster with fewer free slots it would sit there. Counting the slots first turns that
into an immediate, explained error.
"""

from __future__ import annotations

import time

from keras_dl.errors import DistributedError


def free_task_slots(sc) -> tuple[int, int]:
    """``(total, free)`` task slots of the SparkContext's executors right now.

    Total is what Spark itself uses to admit barrier stages (executor cores divided by
    ``spark.task.cpus``); free subtracts the tasks running now.
    """
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    total = int(jsc.maxNumConcurrentTasks(profile))
    running = sum(int(e.numRunningTasks()) for e in jsc.statusTracker().getExecutorInfos())
    return total, max(0, total - running)


def wait_for_free_slots(np: int, timeout: float = 30.0, settle: float = 5.0) -> None:
    """Return once the active SparkSession has ``np`` free task slots; fail fast otherwise.

    Executors register a few seconds after a session starts, so the count is polled until it
    reaches ``np``, or has stayed the same for ``settle`` seconds, or ``timeout`` passes.

    Raises:
        DistributedError: When there is no active SparkSession, or too few free slots.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise DistributedError(
            f"runtime.np={np} runs {np} Spark tasks, but there is no active SparkSession. Start "
            "one first (SparkSession.builder.master('spark://HOST:7077').getOrCreate()), or use "
            f"runtime.np=-{np} for {np} processes on this host."
        )
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        total, free = free_task_slots(sc)
        if free >= np:
            return
        now = time.monotonic()
        if (total, free) != last:
            last, since = (total, free), now
        if (total > 0 and now - since >= settle) or now >= deadline:
            raise DistributedError(
                f"runtime.np={np} needs {np} free Spark task slots, but the cluster at "
                f"{sc.master} has {free} free of {total} (one Horovod process per task, "
                "scheduled all at once). Use runtime.np <= "
                f"{max(free, 1)}, add executors or cores, or wait for running jobs to finish."
            )
        time.sleep(0.5)
