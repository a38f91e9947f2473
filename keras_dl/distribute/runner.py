"""Launch a function on N Horovod ranks, with Databricks ``HorovodRunner`` semantics.

``HorovodRunner(np=-2).run(main, **kwargs)`` runs ``main(**kwargs)`` in 2 processes on this host
(Gloo); ``HorovodRunner(np=4)`` runs it in 4 Spark tasks of the active SparkSession's cluster
(``horovod.spark.run``). It returns rank 0's return value. Worker output is streamed back,
each line prefixed by ``[rank]``. If any rank raises or dies, the others are terminated and
:class:`~keras_dl.errors.DistributedError` names the rank and the cause.

Example:
    >>> def main(lr):
    ...     import horovod.tensorflow as hvd      # imports inside: the function must pickle
    ...     hvd.init()
    ...     return hvd.rank(), lr
    >>> HorovodRunner(np=-2).run(main, lr=0.1)          # doctest: +SKIP
    (0, 0.1)

:func:`launch` is what ``keras-dl train ... --set runtime.strategy=horovod --set runtime.np=N``
runs: ``keras_dl.train.fit`` on every rank, with the MLflow run created (and, on failure,
ended FAILED) by this driver process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keras_dl import storage, tracking
from keras_dl.distribute.failures import explain_failure, report_failure
from keras_dl.distribute.loopback import LOOPBACK, bound_to, check_local_job_address, spark_conf
from keras_dl.distribute.mainguard import check_main_guard
from keras_dl.distribute.recovery import run_with_recovery
from keras_dl.distribute.slots import wait_for_free_slots
from keras_dl.errors import PREEMPTED_EXIT, DistributedError, Preempted
from keras_dl.runlock import HELD_BY_LAUNCHER, launcher_key, open_run_lock


class HorovodRunner:
    """Run a function on ``abs(np)`` Horovod ranks and return rank 0's result.

    Args:
        np: ``< 0``: run ``-np`` processes on this host with Gloo. ``> 0``: run ``np`` Spark
            tasks on the active SparkSession's cluster (one process per task).
        start_timeout: Seconds to wait for every process or Spark task to start. Defaults to 120.
        env: Extra environment variables for the ranks. Defaults to None.
        stall_timeout: Seconds a rank may wait in a collective (a training step's gradient
            allreduce, the start-of-training broadcast, an epoch's metric average) before the
            job ends, naming that rank and the collective; used by
            :class:`~keras_dl.distribute.stall.StallWatchdog` in ``main``'s ``fit``.
            Defaults to 120.
        bind_address: Address Horovod's servers in this process listen on. With ``np < 0``
            it must be loopback or "0.0.0.0"; with ``np > 0`` (Spark executors must reach the
            driver) only a value other than the default changes Horovod's own, which listens
            on every interface. Defaults to "127.0.0.1".
    """

    def __init__(
        self,
        np: int,
        start_timeout: int = 120,
        env: dict[str, str] | None = None,
        stall_timeout: int = 120,
        bind_address: str = LOOPBACK,
    ):
        if np == 0:
            raise DistributedError(
                "HorovodRunner(np=0) runs nothing: use np=-N for N processes on this host or "
                "np=N for N Spark tasks."
            )
        self.np = np
        self.start_timeout = start_timeout
        self.stall_timeout = stall_timeout
        self.env = dict(env or {})
        self.bind_address = bind_address
        if np < 0:
            check_local_job_address(bind_address)

    def run(self, main: Callable, **kwargs) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what rank 0 returned.

        ``main`` and ``kwargs`` are pickled (cloudpickle) to the ranks: import what ``main``
        needs inside its body, and do not close over locks, sessions or open files.

        Raises:
            DistributedError: When it is called from a script outside
                ``if __name__ == "__main__":`` (np < 0), ``main`` does not pickle, Horovod is
                missing, there are not enough free Spark task slots, or a rank fails (naming
                it and the cause).
        """
        if self.np < 0:
            check_main_guard()  # the local launcher re-imports the main script
        payload = _check_pickles(main, kwargs)
        from keras_dl.distribute.horovod import import_horovod

        import_horovod()  # a clear error here rather than in every rank
        env = _rank_env(self.env)
        # The ranks' StallWatchdog reads it (keras_dl.distribute.stall).
        env.setdefault("KERAS_DL_STALL_TIMEOUT", str(self.stall_timeout))
        with tempfile.TemporaryDirectory(prefix="keras_dl_hvd_") as logs:
            try:
                if self.np < 0:
                    results = self._run_local(payload, env, logs)
                else:
                    results = self._run_spark(payload, env, logs)
            except (DistributedError, Preempted):
                raise
            except Exception as exc:
                raise explain_failure(exc, logs, size=abs(self.np)) from exc
        return results[0]

    def _run_local(self, payload: bytes, env: dict, logs: str) -> list:
        from horovod.runner import run as horovod_run

        n = -self.np
        # Each rank's stdout/stderr goes to sys.stdout/sys.stderr prefixed "[rank]<stdout>:",
        # and a copy to logs/rank.N/ which the driver reads to name a failure's cause.
        # The rendezvous and key-value servers listen on bind_address (loopback by default):
        # the ranks are on this host, and the key-value store accepts pickles.
        # horovod.runner.run passes the driver's environment to the ranks.
        with _environ(env), bound_to(self.bind_address):
            return horovod_run(
                _rank_main,
                args=(payload,),
                num_proc=n,
                hosts=f"localhost:{n}",
                use_gloo=True,
                start_timeout=self.start_timeout,
                output_filename=logs,
                verbose=0,
            )

    def _run_spark(self, payload: bytes, env: dict, logs: str) -> list:
        import horovod.spark

        wait_for_free_slots(self.np, timeout=min(self.start_timeout, 30))
        out = _Tee(sys.stdout, Path(logs) / "spark.out")
        err = _Tee(sys.stderr, Path(logs) / "spark.err")
        # Executors on other hosts must reach the driver's services: keep Horovod's binding
        # (every interface) unless the user chose another address than the default.
        widened = self.bind_address != LOOPBACK
        scope = bound_to(self.bind_address) if widened else contextlib.nullcontext()
        try:
            with scope:
                return horovod.spark.run(
                    _rank_main,
                    args=(payload,),
                    num_proc=self.np,
                    start_timeout=self.start_timeout,
                    use_gloo=True,
                    env=env,
                    stdout=out,
                    stderr=err,
                    verbose=0,
                )
        finally:
            out.close()
            err.close()


def launch(exp, main: Callable | None = None) -> Any:
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
        exp: A resolved experiment with ``runtime.strategy="horovod"`` and ``runtime.np != 0``.
        main: ``fn(exp, run_id)`` run on every rank. Defaults to :func:`train_rank`.

    Returns:
        What ``main`` returned on rank 0 (a :class:`~keras_dl.train.TrainResult` by default).
    """
    if exp.runtime.strategy != "horovod":
        exp = dataclasses.replace(exp, runtime=dataclasses.replace(exp.runtime, strategy="horovod"))
    from keras_dl.distribute.horovod import import_horovod

    import_horovod()  # fail before creating a run that could never start
    if exp.train.batch_size is None or exp.train.epochs is None:
        from keras_dl.recipe import configure, load_recipe

        # Settings the recipe chooses from the table (tabular: batch size, epochs), chosen once
        # here, so the run's params and config.yaml hold them and every rank gets the same.
        exp = configure(exp, load_recipe(exp.recipe))
    runner = HorovodRunner(
        exp.runtime.np,
        start_timeout=exp.runtime.start_timeout,
        stall_timeout=exp.runtime.stall_timeout,
        bind_address=exp.runtime.bind_address,
        # The driver holds runtime.run_dir's lock: rank 0's fit must not wait for it.
        env={HELD_BY_LAUNCHER: launcher_key(exp.runtime.run_dir)},
    )
    spark = None
    # The driver holds runtime.run_dir's lock for the whole job (ranks come and go).
    lock = open_run_lock(exp.runtime.run_dir, exp.runtime.lease_seconds)
    lock.acquire()
    try:
        spark = _start_spark(exp.runtime) if exp.runtime.np > 0 else None
        from keras_dl.callbacks.defaults import record_config, resume_run_id

        tracking.check_reachable(exp.tracking.uri)  # before asking for a run to resume
        # An interrupted job with a checkpoint in runtime.run_dir continues its own run.
        run_id = resume_run_id(exp)
        if run_id is None:
            record_config(exp)
            run_id = tracking.create_run(exp, {"keras_dl.np": str(exp.runtime.np)})
        lock.update(run_id)
        try:
            return run_with_recovery(
                lambda: runner.run(main or train_rank, exp=exp, run_id=run_id),
                exp.runtime.max_restarts,
                lambda count, cause: _log_restart(exp, run_id, count, cause),
            )
        except Preempted as exc:  # KILLED, not FAILED: rerunning the command resumes it
            tracking.terminate_run(
                exp.tracking.uri, run_id, "KILLED", {"preempted": exc.signal_name}
            )
            raise
        except BaseException as exc:
            tracking.terminate_run(exp.tracking.uri, run_id, "FAILED", tracking.failure_tags(exc))
            raise
    finally:
        lock.release()
        if spark is not None:
            spark.stop()


def _start_spark(runtime):
    """A SparkSession for ``np > 0`` when none is active (the CLI); None when one is.

    Its master comes from Spark's own configuration: the ``MASTER`` environment variable or
    ``spark-defaults.conf``, else ``local[*]``. On a local master its driver listens on
    ``runtime.bind_address``; its web UI runs only with ``runtime.spark_ui``.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        return None
    # Spark's Python workers otherwise run `python3` from PATH, which may lack Horovod.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("keras_dl-horovod")
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
    result = fit(exp, run_id=run_id)
    result.model = None
    return result


# -- private helpers ---------------------------------------------------------------------------


def _rank_main(payload: bytes):
    """Entry point on each rank: unpickle ``(main, kwargs)`` and run it; report failures."""
    import cloudpickle

    main, kwargs = cloudpickle.loads(payload)
    try:
        return main(**kwargs)
    except BaseException as exc:
        report_failure(exc)
        # Exit now: the other ranks may be blocked in a collective with this one, and Horovod's
        # background thread could keep this interpreter alive. The launcher sees the non-zero
        # exit and terminates the rest of the job.
        os._exit(PREEMPTED_EXIT if isinstance(exc, Preempted) else 1)


def _check_pickles(main: Callable, kwargs: dict) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((main, kwargs))
    except Exception as exc:
        name = getattr(main, "__qualname__", repr(main))
        raise DistributedError(
            f"The function {name!r} (or its arguments {sorted(kwargs)}) cannot be pickled to "
            f"the Horovod ranks: {type(exc).__name__}: {exc}. Define it at module level or as a "
            "plain closure, do the imports it needs inside its body, and pass data, not locks, "
            "sessions, open files or models."
        ) from None


def _rank_env(extra: dict) -> dict:
    """Environment for the ranks: our import path (so keras_dl and recipes import) and quiet TF."""
    paths = [p for p in (os.getcwd(), str(Path(__file__).resolve().parents[2])) if p]
    old = os.environ.get("PYTHONPATH", "")
    env = {
        "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])]),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        "PYTHONUNBUFFERED": "1",  # stream rank output as it is printed
    }
    if os.environ.get("MLFLOW_TRACKING_URI"):
        env["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
    # The object-store settings (a table or run_dir on S3, MLflow artifacts there): Spark
    # executors keep the environment they started with, which may lack them.
    env.update(storage.environment())
    return {**env, **extra}


@contextlib.contextmanager
def _environ(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _log_restart(exp, run_id: str, count: int, cause: str) -> None:
    """Say and record (metric keras_dl.restarts, tag keras_dl.restart.N) why the job restarts."""
    import mlflow

    print(
        f"Restart {count}/{exp.runtime.max_restarts} of the Horovod job from the newest "
        f"checkpoint in {exp.runtime.run_dir}, in MLflow run {run_id}. Cause: {cause}",
        flush=True,
    )
    client = mlflow.MlflowClient(exp.tracking.uri)
    client.log_metric(run_id, "keras_dl.restarts", count, step=count)
    client.set_tag(run_id, f"keras_dl.restart.{count}", cause[:5000])


class _Tee:
    """A text stream that writes to ``stream`` and keeps a copy in ``path``."""

    def __init__(self, stream, path: Path):
        self.stream = stream
        self.file = open(path, "w")  # noqa: SIM115 (closed by close())

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.file.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()

    def close(self) -> None:
        self.file.close()
