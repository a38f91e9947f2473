"""Launch a function on N Horovod ranks, with Databricks ``HorovodRunner`` semantics.

``HorovodRunner(np=-2).run(main, **kwargs)`` runs ``main(**kwargs)`` in 2 processes on this host
(Gloo); ``HorovodRunner(np=4)`` runs it in 4 Spark tasks of the active SparkSession's cluster
(``horovod.spark.run`` on a classic session; on a Spark Connect session, which has no
sparkContext, a barrier stage: :mod:`keras_dl.launch.barrier`). It returns rank 0's return
value. Worker output is streamed back while the ranks run (on Connect: through a folder the
executors reach, :mod:`keras_dl.launch.rank_output`), each line prefixed by ``[rank]``. If any rank raises or dies, the others are terminated and
:class:`~keras_dl.errors.DistributedError` names the rank and the cause; a keras_dl error a rank
raised (a ``DataError`` for a bad file, ...) is raised as that class instead, with its whole
message and so its exit code (:mod:`keras_dl.distribute.failures`).

Example:
    >>> def main(lr):
    ...     import horovod.tensorflow as hvd      # imports inside: the function must pickle
    ...     hvd.init()
    ...     return hvd.rank(), lr
    >>> HorovodRunner(np=-2).run(main, lr=0.1)          # doctest: +SKIP
    (0, 0.1)

:func:`keras_dl.launch.job.launch` runs ``keras_dl.train.fit`` on the ranks with this class.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keras_dl import storage
from keras_dl.connect import is_connect
from keras_dl.distribute.failures import explain_failure
from keras_dl.distribute.interfaces import check_spark_interfaces
from keras_dl.distribute.kernel_log import job_clock
from keras_dl.distribute.loopback import LOOPBACK, bound_to, check_local_job_address
from keras_dl.distribute.mainguard import check_main_guard
from keras_dl.distribute.np_check import check_local_np
from keras_dl.distribute.slots import active_session, wait_for_free_slots
from keras_dl.errors import DistributedError, HostLost, Preempted
from keras_dl.launch.rank import HOROVOD_SETTINGS, KEPT, rank_main
from keras_dl.launch.spark_run import stop_all_on_first_failure, stream_task_output


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
            :class:`~keras_dl.callbacks.stall.StallWatchdog` in ``main``'s ``fit``.
            Defaults to 120.
        bind_address: Address Horovod's servers in this process listen on. With ``np < 0``
            it must be loopback or "0.0.0.0"; with ``np > 0`` (Spark executors must reach the
            driver) only a value other than the default changes Horovod's own, which listens
            on every interface. Defaults to "127.0.0.1".
        output_dir: On a Spark Connect session: a folder this process and the executors both
            reach (a shared path, ``s3://...``, ``abfss://...``) where the ranks write their
            output while they run; each job uses a new subfolder and removes its files at the
            end. Defaults to None: a local temporary folder when the Connect server and its
            executors run on this host; elsewhere the output is printed when the job ends and
            ``start_timeout`` does not apply.
    """

    def __init__(
        self,
        np: int,
        start_timeout: int = 120,
        env: dict[str, str] | None = None,
        stall_timeout: int = 120,
        bind_address: str = LOOPBACK,
        output_dir: str | None = None,
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
        self.output_dir = output_dir
        if np < 0:
            check_local_job_address(bind_address)

    def run(self, main: Callable, **kwargs) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what rank 0 returned.

        ``main`` and ``kwargs`` are pickled (cloudpickle) to the ranks: import what ``main``
        needs inside its body, and do not close over locks, sessions or open files.

        Raises:
            DistributedError: When it is called from a script outside
                ``if __name__ == "__main__":`` (np < 0), ``-np`` ranks need more memory or
                GPUs than this host has (:mod:`keras_dl.distribute.np_check`), ``main`` does
                not pickle, Horovod is missing, there are not enough free Spark task slots, or
                a rank fails (naming it and the cause).
            KerasDLError: A rank raised a keras_dl error (``DataError``, ``ConfigError``,
                ``DivergenceError``, ...): the same class, naming the rank.
        """
        if self.np < 0:
            check_main_guard()  # the local launcher re-imports the main script
            check_local_np(self.np)  # ranks this host's memory and GPUs can hold
        payload = _check_pickles(main, kwargs)
        from keras_dl.distribute.horovod import import_horovod

        import_horovod()  # a clear error here rather than in every rank
        env = _rank_env(self.env)
        # The ranks' StallWatchdog reads it (keras_dl.callbacks.stall).
        env.setdefault("KERAS_DL_STALL_TIMEOUT", str(self.stall_timeout))
        started = job_clock()  # the kernel's log of a killed rank is read from here on
        with tempfile.TemporaryDirectory(prefix="keras_dl_hvd_") as logs:
            try:
                if self.np < 0:
                    results = self._run_local(payload, env, logs)
                else:
                    results = self._run_spark(payload, env, logs)
            except (DistributedError, Preempted):
                raise
            except Exception as exc:
                raise explain_failure(exc, logs, size=abs(self.np), started=started) from exc
        return results[0]

    def _run_local(self, payload: bytes, env: dict, logs: str) -> list:
        from horovod.runner import run as horovod_run

        n = -self.np
        # Each rank's stdout/stderr goes to sys.stdout/sys.stderr prefixed "[rank]<stdout>:",
        # and a copy to logs/rank.N/ which the driver reads to name a failure's cause.
        # The rendezvous and key-value servers listen on bind_address (loopback by default):
        # the ranks are on this host, and the key-value store accepts pickles.
        # horovod.runner.run passes the driver's environment to the ranks.
        # horovod.runner.run replaces two of them with "(None,)": the ranks restore these.
        kept = {KEPT + k: os.environ[k] for k in HOROVOD_SETTINGS if k in os.environ}
        env = {**kept, **env}
        with _environ(env), bound_to(self.bind_address), _one_rank_padding():
            return horovod_run(
                rank_main,
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

        # Executors of a new session can take long to register on a busy cluster: wait up to
        # start_timeout for the first, then fail fast once the count has settled below np.
        wait_for_free_slots(self.np, timeout=self.start_timeout, settle=10.0)
        spark = active_session()
        if is_connect(spark):
            from keras_dl.launch.barrier import run_barrier

            # The tasks start their own rendezvous: the client need not be reachable from them.
            return run_barrier(
                spark, payload, self.np, env, logs, self.start_timeout, self.output_dir
            )
        # Hosts with no interface name in common: refused now, not after start_timeout; tasks
        # away from the driver: the interface they reach it on, never lo.
        nics = check_spark_interfaces(spark.sparkContext, self.np)
        out = _Tee(sys.stdout, Path(logs) / "spark.out")
        err = _Tee(sys.stderr, Path(logs) / "spark.err")
        # Executors on other hosts must reach the driver's services: keep Horovod's binding
        # (every interface) unless the user chose another address than the default.
        widened = self.bind_address != LOOPBACK
        scope = bound_to(self.bind_address) if widened else contextlib.nullcontext()
        try:
            # Horovod's Spark launcher leaves the other ranks running after one died, and
            # forwards their output in 64 KiB bursts (keras_dl.launch.spark_run).
            with scope, stop_all_on_first_failure() as lost, stream_task_output():
                try:
                    return horovod.spark.run(
                        rank_main,
                        args=(payload,),
                        num_proc=self.np,
                        start_timeout=self.start_timeout,
                        use_gloo=True,
                        env=env,
                        stdout=out,
                        stderr=err,
                        verbose=0,
                        nics=nics,
                    )
                except Exception:
                    if lost:  # a rank's host stopped answering: rerun on the hosts left
                        raise HostLost(*lost[0]) from None
                    raise
        finally:
            out.close()
            err.close()


# -- private helpers ---------------------------------------------------------------------------


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


def _pad_rank(rank: int, size: int) -> str:
    """The rank as Horovod names its output folder ``rank.N``: zero-padded to the width of the
    largest rank, ``size - 1`` (Horovod's own takes ``log10(size - 1)``, which fails for 1)."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


@contextlib.contextmanager
def _one_rank_padding():
    """Within this block, Horovod's local launcher can run a single rank (``np=-1``).

    Horovod 0.28.1 names each rank's output folder with ``horovod/runner/gloo_run.py``'s
    ``_pad_rank``, ``int(math.log10(size - 1)) + 1`` digits: for one rank that is
    ``log10(0)``, a "math domain error" before the rank starts. This names the folders alike
    for every size and ``rank.0`` for one rank.
    """
    import horovod.runner.gloo_run as gloo_run

    original = gloo_run._pad_rank
    gloo_run._pad_rank = _pad_rank
    try:
        yield
    finally:
        gloo_run._pad_rank = original


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
