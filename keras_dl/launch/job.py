"""Train an experiment on Horovod ranks: ``keras-dl train ... --set runtime.strategy=horovod
--set runtime.np=N`` runs :func:`launch`, which runs ``keras_dl.train.fit`` on every rank; with
``runtime.strategy=multiworker`` the same, on the workers of TF's MultiWorkerMirroredStrategy
(:class:`~keras_dl.launch.workers.MultiWorkerRunner`).

The driver process owns the run (:func:`keras_dl.run.open_run` with ``driver=True``): it holds
the run folder's lock, creates the MLflow run, and restarts the job from the newest checkpoint
when a rank is lost (:mod:`keras_dl.distribute.recovery`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from keras_dl import storage
from keras_dl.connect import is_connect
from keras_dl.distribute.loopback import LOOPBACK, spark_conf
from keras_dl.distribute.np_check import check_local_np
from keras_dl.distribute.recovery import run_with_recovery
from keras_dl.distribute.slots import active_session, wait_for_free_slots
from keras_dl.extras import import_extra
from keras_dl.launch.metrics_relay import MetricsRelay
from keras_dl.launch.runner import HorovodRunner
from keras_dl.launch.shared_storage import check_shared_storage
from keras_dl.launch.workers import MultiWorkerRunner
from keras_dl.run import open_run
from keras_dl.runlock import HELD_BY_LAUNCHER, launcher_key
from keras_dl.storage import retry

log = logging.getLogger(__name__)


def launch(exp, main: Callable | None = None, run_id: str | None = None) -> Any:
    """Train ``exp`` on ``runtime.np`` Horovod ranks; return rank 0's result.

    The driver creates the MLflow run (config as params) and passes its id to the ranks; rank 0
    attaches to it and ends it; a relaunch after a failure continues the same run from the last
    checkpoint in ``runtime.run_dir``. A rank that dies or is preempted relaunches the job from
    the newest checkpoint, up to ``runtime.max_restarts`` times (see
    :mod:`keras_dl.distribute.recovery`). Otherwise, if the job fails (a rank raised, did not
    start, or the restarts are used up), the driver ends the run FAILED and raises; if the job
    was preempted (SIGTERM/SIGINT, to the driver or its ranks), it ends it KILLED with a
    ``preempted`` tag and raises :class:`~keras_dl.errors.Preempted`. With ``np > 0`` and no
    active SparkSession, one is started (and stopped after) on the master from ``MASTER`` or
    ``spark-defaults.conf``.

    Args:
        exp: A resolved experiment with ``runtime.np != 0`` and ``runtime.strategy`` "horovod"
            or "multiworker" (any other strategy runs as "horovod").
        main: ``fn(exp, run_id)`` run on every rank. Defaults to :func:`train_rank`.
        run_id: An MLflow run to continue (the Spark estimator's). Defaults to None: the
            interrupted run ``runtime.run_dir`` records, else a new one.

    Returns:
        What ``main`` returned on rank 0 (a :class:`~keras_dl.train.TrainResult` by default).
    """
    if exp.runtime.strategy not in ("horovod", "multiworker"):
        exp = dataclasses.replace(exp, runtime=dataclasses.replace(exp.runtime, strategy="horovod"))
    if exp.runtime.strategy == "horovod":
        from keras_dl.distribute.horovod import import_horovod

        import_horovod()  # fail before creating a run that could never start
    if exp.runtime.np > 0:  # ranks as Spark tasks: PySpark first, before any table is read
        import_extra("pyspark", f"runtime.np={exp.runtime.np} (one rank per Spark task)")
    if exp.train.batch_size is None or exp.train.epochs is None:
        from keras_dl.recipe import configure, load_recipe

        # Settings the recipe chooses from the table (tabular: batch size, epochs), chosen once
        # here, so the run's params and config.yaml hold them and every rank gets the same.
        exp = configure(exp, load_recipe(exp.recipe))
    if main is None:  # train_rank: fit with exp.recipe, whose checks run before the run starts
        from keras_dl.recipe import check_model, load_recipe

        check_model(exp, load_recipe(exp.recipe))  # e.g. model.num_classes against the labels
    runner = _runner(exp)
    spark = None
    # The driver holds runtime.run_dir's lock for the whole job (ranks come and go), creates
    # the MLflow run (or continues the interrupted one the folder records, or ``run_id``), and
    # ends it FAILED or KILLED (preempted: rerunning the command resumes it) if the job fails.
    try:
        # A runtime.np the job cannot run, or folders rank 0 cannot reach from its host, are
        # refused before the run exists and before any rank starts.
        check_local_np(exp.runtime.np)
        if exp.runtime.np > 0:
            spark = start_spark(exp.runtime)
            wait_for_free_slots(exp.runtime.np, timeout=exp.runtime.start_timeout, settle=10.0)
            check_shared_storage(active_session(), exp)
        with open_run(exp, run_id=run_id, lock_run_dir=True, driver=True) as run:
            run_id = run.start({"keras_dl.np": str(exp.runtime.np)})
            # tracking.prometheus_port is served here, where a scraper finds it, fed by rank 0.
            relay = _metrics_relay(exp, run_id)
            if relay is not None:
                runner.env.update(relay.start())
            try:
                return run_with_recovery(
                    lambda: runner.run(main or train_rank, exp=exp, run_id=run_id),
                    exp.runtime.max_restarts,
                    lambda count, cause: _log_restart(exp, run_id, count, cause),
                )
            finally:
                if relay is not None:
                    relay.close()
    finally:
        if spark is not None:
            spark.stop()


def _runner(exp):
    """The launcher of ``exp``'s engine: Horovod's ranks or the multi-worker strategy's workers."""
    # The driver holds runtime.run_dir's lock: rank 0's fit must not wait for it.
    env = {HELD_BY_LAUNCHER: launcher_key(exp.runtime.run_dir)}
    # On Spark the ranks (Horovod's, on Spark Connect; the multi-worker strategy's on any
    # session) write their output there while they run: the run folder, which the executors
    # reach, as they write their checkpoints there.
    kind = MultiWorkerRunner if exp.runtime.strategy == "multiworker" else HorovodRunner
    return kind(
        exp.runtime.np,
        start_timeout=exp.runtime.start_timeout,
        stall_timeout=exp.runtime.stall_timeout,
        bind_address=exp.runtime.bind_address,
        output_dir=storage.join(str(exp.runtime.run_dir), "rank-output"),
        env=env,
    )


def start_spark(runtime):
    """A SparkSession for ``np > 0`` when none is active (the CLI); None when one is.

    Its master comes from Spark's own configuration: the ``MASTER`` environment variable or
    ``spark-defaults.conf``, else ``local[*]``; with ``SPARK_REMOTE`` set, it is a Spark Connect
    session on that server. On a local master its driver listens on
    ``runtime.bind_address``; its web UI runs only with ``runtime.spark_ui``.
    """
    from pyspark.sql import SparkSession

    if active_session() is not None:
        return None
    # Spark's Python workers otherwise run `python3` from PATH, which may lack Horovod.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("keras_dl-horovod")
    if os.environ.get("SPARK_REMOTE") or os.environ.get("SPARK_API_MODE") == "connect":
        return builder.getOrCreate()  # a Spark Connect server: its driver is configured there
    for key, value in spark_conf(
        None, bind_address=runtime.bind_address, ui=runtime.spark_ui
    ).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def train_rank(exp, run_id: str | None = None):
    """What every rank runs under :func:`launch`: ``fit`` on its shard of the data.

    The Keras model itself stays on the rank (load it from ``result.model_uri``).
    """
    import warnings

    from keras_dl.train import fit

    # The same filter as the CLI's: pyarrow deprecation noise from Petastorm, once per rank.
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    if storage.local_path(str(exp.runtime.run_dir)) is None:
        retry.wait_within_lease(exp.runtime.lease_seconds)  # the launcher holds the store's lease
    result = fit(exp, run_id=run_id)
    result.model = None
    return result


def _metrics_relay(exp, run_id: str) -> MetricsRelay | None:
    """The driver's Prometheus endpoint for ``tracking.prometheus_port``, or None: no port, or a
    Spark Connect session (its executors need not reach this process: rank 0 serves it)."""
    t = exp.tracking
    if t.prometheus_port is None:
        return None
    feed_bind = LOOPBACK
    if exp.runtime.np > 0:
        session = active_session()
        if session is None or is_connect(session):
            log.info(
                "On Spark Connect the executors may not reach this process: rank 0 serves "
                "tracking.prometheus_port on its own host."
            )
            return None
        feed_bind = session.conf.get("spark.driver.host", LOOPBACK) or LOOPBACK
        if feed_bind != LOOPBACK:
            log.warning(
                "The ranks send their Prometheus figures to this process on %s "
                "(spark.driver.host, the address the executors reach the driver at).",
                feed_bind,
            )
    return MetricsRelay(
        run_id,
        exp.recipe,
        t.prometheus_port,
        t.prometheus_bind,
        feed_bind,
        t.prometheus_final_scrape_seconds,
    )


def _log_restart(exp, run_id: str, count: int, cause: str) -> None:
    """Say and record (metric keras_dl.restarts, tag keras_dl.restart.N) why the job restarts."""
    from keras_dl import tracking

    engine = "multi-worker" if exp.runtime.strategy == "multiworker" else "Horovod"
    print(
        f"Restart {count}/{exp.runtime.max_restarts} of the {engine} job from the newest "
        f"checkpoint in {exp.runtime.run_dir}, in MLflow run {run_id}. Cause: {cause}",
        flush=True,
    )
    client = tracking.client(exp.tracking.uri)
    client.log_metric(run_id, "keras_dl.restarts", count, step=count)
    client.set_tag(run_id, f"keras_dl.restart.{count}", cause[:5000])
