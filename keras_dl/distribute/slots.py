"""Free Spark task slots: check them before asking Horovod for ``np`` tasks.

``horovod.spark.run`` waits up to its start timeout (600 s by default) for all ``np`` tasks to
start; on a cluster with fewer free slots it would sit there. Counting the slots first turns that
into an immediate, explained error.

A Spark Connect session (Databricks shared and serverless clusters) has no ``sparkContext``:
there the total comes from the session's configuration (:func:`configured_task_slots`), and the
check is skipped, with a log line, when that does not tell it.
"""

from __future__ import annotations

import logging
import re
import time

from keras_dl.connect import is_connect
from keras_dl.distribute.driver_address import (
    executors_launching,
    explain_unregistered_executors,
)
from keras_dl.errors import DistributedError

log = logging.getLogger(__name__)


def active_session():
    """The active SparkSession, Spark Connect or classic; None when there is none.

    A Connect session on a local server (``SparkSession.builder.remote("local[2]")``) shares
    its process with that server's classic context: the Connect session is the user's while
    pyspark is in Connect mode (what ``builder.remote`` turns on, and what picks the Connect
    flavour of ``functions`` and Spark ML), or when no classic context exists. A process that
    left Connect mode for its classic session gets the classic one.
    """
    import sys

    classic_context = None
    try:
        from pyspark import SparkContext

        classic_context = SparkContext._active_spark_context
    except ImportError:  # no PySpark (a core install): no session either
        return None
    if "pyspark.sql.connect.session" in sys.modules:  # imported once a Connect session exists
        from pyspark.sql.connect.session import SparkSession as ConnectSession
        from pyspark.sql.utils import is_remote

        if is_remote() or classic_context is None:
            session = ConnectSession.getActiveSession() or ConnectSession._get_default_session()
            if session is not None and not session.is_stopped:
                return session
    if classic_context is None:
        return None
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def configured_task_slots(spark) -> int | None:
    """Task slots a session's configuration promises, or None when it does not say.

    ``local[N]`` gives N; a cluster gives ``spark.cores.max``, else ``spark.executor.instances``
    times ``spark.executor.cores``, divided by ``spark.task.cpus``.
    """

    def conf(key: str) -> str | None:
        try:
            return spark.conf.get(key, None)
        except Exception:  # a key the server refuses to show
            return None

    task_cpus = int(conf("spark.task.cpus") or 1)
    master = conf("spark.master") or ""
    local = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    if local:
        return int(local.group(1)) // task_cpus
    if master == "local":
        return 1
    if conf("spark.cores.max"):
        return int(conf("spark.cores.max")) // task_cpus
    if conf("spark.executor.instances") and conf("spark.executor.cores"):
        cores = int(conf("spark.executor.instances")) * int(conf("spark.executor.cores"))
        return cores // task_cpus
    return None


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


LAUNCH_WAIT = 90.0


def wait_for_free_slots(np: int, timeout: float = 30.0, settle: float = 5.0) -> None:
    """Return once the active SparkSession has ``np`` free task slots; fail fast otherwise.

    Executors register a few seconds after a session starts, so the count is polled until it
    reaches ``np``, or has stayed the same for ``settle`` seconds, or ``timeout`` passes. While
    the master has granted cores to executors that have not registered yet (JVMs starting on a
    loaded host), and the driver's address accepts connections, it waits up to ``LAUNCH_WAIT``
    seconds of no change instead of ``settle``.

    Raises:
        DistributedError: When there is no active SparkSession, or too few free slots.
    """
    spark = active_session()
    if spark is None:
        raise DistributedError(
            f"runtime.np={np} runs {np} Spark tasks, but there is no active SparkSession. Start "
            "one first (SparkSession.builder.master('spark://HOST:7077').getOrCreate()), or use "
            f"runtime.np=-{np} for {np} processes on this host."
        )
    if is_connect(spark):
        _check_configured_slots(spark, np)
        return
    sc = spark.sparkContext
    _check_configured_total(spark, sc.master, np)
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        total, free = free_task_slots(sc)
        if free >= np:
            return
        now = time.monotonic()
        if (total, free) != last:
            last, since = (total, free), now
        # Executors the master granted that are still starting get up to LAUNCH_WAIT more.
        stable = now - since
        settled = total > 0 and (
            stable >= max(settle, LAUNCH_WAIT) or (stable >= settle and not executors_launching(sc))
        )
        if settled or now >= deadline:
            # The checks above read the master and the driver after the count: an executor
            # that registered meanwhile (its JVM just started) is counted before refusing.
            total, free = free_task_slots(sc)
            if free >= np:
                return
            if (total, free) != last and now < deadline:
                last, since = (total, free), time.monotonic()
                continue
            unreachable = explain_unregistered_executors(sc, np)
            if unreachable:
                raise DistributedError(unreachable)
            if total < np:  # not a busy cluster: one too small for the job
                raise DistributedError(
                    f"runtime.np={np} needs {np} free Spark task slots, but the cluster at "
                    f"{sc.master} has {free} free of {total} in all ({_executors(sc)}; "
                    "one Horovod process per task, scheduled all at once). Use runtime.np <= "
                    f"{max(total, 1)}, or add workers or cores to the cluster."
                )
            raise DistributedError(
                f"runtime.np={np} needs {np} free Spark task slots, but the cluster at "
                f"{sc.master} has {free} free of {total} (one Horovod process per task, "
                "scheduled all at once). Use runtime.np <= "
                f"{max(free, 1)}, add executors or cores, or wait for running jobs to finish."
            )
        time.sleep(0.5)


def _check_configured_total(spark, master: str, np: int) -> None:
    """Refuse at once an ``np`` above the slots the session's configuration allows in all
    (``spark.cores.max``, ...): no executor that registers later can make room for it."""
    total = configured_task_slots(spark)
    if total is not None and total < np:
        raise DistributedError(
            f"runtime.np={np} needs {np} free Spark task slots, but the cluster at {master} "
            f"has {total} free of {total} at most: {_configured(spark)} (one Horovod process "
            f"per task, scheduled all at once). Use runtime.np <= {max(total, 1)}, or raise "
            "those settings on a cluster with more cores."
        )


def _configured(spark) -> str:
    """The settings :func:`configured_task_slots` counts from, as ``key=value`` text."""
    keys = ("spark.master", "spark.cores.max", "spark.executor.instances")
    keys += ("spark.executor.cores", "spark.task.cpus")
    shown = []
    for key in keys:
        try:
            value = spark.conf.get(key, None)
        except Exception:  # a key the server refuses to show
            value = None
        if value is not None:
            shown.append(f"{key}={value}")
    return ", ".join(shown)


def _executors(sc) -> str:
    """``N executor(s) on HOST, HOST: C cores for tasks`` for the session's executors now."""
    jsc = sc._jsc.sc()
    hosts = [str(e.host()) for e in jsc.statusTracker().getExecutorInfos()]
    driver = sc.getConf().get("spark.driver.host", None)
    if len(hosts) > jsc.getExecutorIds().size() and driver in hosts:
        hosts.remove(driver)  # the driver's own entry, listed with the executors
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    cores = int(jsc.maxNumConcurrentTasks(profile)) * cpus
    return (
        f"{len(hosts)} executor(s) on {', '.join(hosts) or 'no host'}: {cores} core(s) for "
        f"tasks, spark.task.cpus={cpus}"
    )


def _check_configured_slots(spark, np: int) -> None:
    """On Spark Connect (no view of the executors): compare ``np`` with the configured slots."""
    total = configured_task_slots(spark)
    if total is None:
        log.warning(
            "runtime.np=%d: a Spark Connect session does not show its free task slots, and its "
            "configuration sets neither spark.cores.max nor spark.executor.instances and "
            "spark.executor.cores: not checking them. The barrier stage waits for %d free "
            "slots up to runtime.start_timeout (when its ranks' output folder is shared).",
            np,
            np,
        )
        return
    if total < np:
        raise DistributedError(
            f"runtime.np={np} needs {np} free Spark task slots, but the Spark Connect session's "
            f"cluster has {total} free of {total} at most (its spark.cores.max or executors, "
            "divided by spark.task.cpus; one Horovod process per task, scheduled all at once). "
            f"Use runtime.np <= {max(total, 1)}, or a cluster with more executors or cores."
        )
