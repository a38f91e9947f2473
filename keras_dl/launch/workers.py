"""Launch a function on N workers of TF's MultiWorkerMirroredStrategy, with ``HorovodRunner``'s
semantics: :class:`MultiWorkerRunner` is its counterpart for a user's own ``fit``.

``MultiWorkerRunner(np=-2).run(main, **kwargs)`` runs ``main(**kwargs)`` in 2 processes on this
host, each with a ``TF_CONFIG`` naming the 2 workers on loopback ports and its own index (worker 0
is the chief), and returns worker 0's return value. Each worker's output is streamed back while
it runs, each line prefixed ``[rank]<stdout>:`` as Horovod's are, and a copy is kept for
:func:`keras_dl.distribute.failures.explain_failure`. A worker that fails or dies ends the others
(SIGKILL: SIGTERM is a preemption to keras_dl) and the error names it; a keras_dl error it raised
is raised as that class; SIGTERM/SIGINT to this process reach every worker, which checkpoint and
stop (:class:`~keras_dl.errors.Preempted`).

``MultiWorkerRunner(np=2)`` runs the workers as the 2 tasks of one Spark barrier stage of the
active classic SparkSession, one per task, each at the address its executor is known by
(:mod:`keras_dl.launch.spark_workers`); a worker that fails ends the stage and the error names its
rank, its host and the cause.

``main`` must create the strategy first (``keras_dl.distribute.multiworker.init()``, or
``keras_dl.train.fit`` with ``runtime.strategy=multiworker``), before any other TensorFlow op.

TensorFlow's gRPC server listens on its port on every interface (0.0.0.0 is hard-coded in
``grpc_server_lib.cc``); the workers reach each other at ``bind_address``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keras_dl.distribute.failures import MULTIWORKER, explain_failure
from keras_dl.distribute.loopback import LOOPBACK, check_local_job_address
from keras_dl.errors import DistributedError, KerasDLError, Preempted
from keras_dl.launch.child import start_module
from keras_dl.launch.runner import _check_pickles, _rank_env
from keras_dl.launch.spark_workers import RANK, pump, tf_config, worker_env
from keras_dl.launch.worker_report import WorkerFailed

__all__ = ["MultiWorkerRunner", "tf_config"]


class MultiWorkerRunner:
    """Run a function on ``abs(np)`` multi-worker processes and return worker 0's result.

    Args:
        np: ``< 0``: run ``-np`` processes on this host. ``> 0``: run ``np`` tasks of one
            Spark barrier stage of the active (classic) SparkSession, one worker per task
            (:mod:`keras_dl.launch.spark_workers`).
        start_timeout: Seconds every worker has to start its server (with ``np > 0``: for the
            cluster's free task slots, then for the barrier stage's tasks to start, or the
            stage is cancelled). Defaults to 120.
        env: Extra environment variables for the workers. Defaults to None.
        stall_timeout: Seconds a worker may wait in a collective (read by ``fit``'s
            ``runtime.stall_timeout`` through ``KERAS_DL_STALL_TIMEOUT``). Defaults to 120.
        bind_address: The address the workers reach each other at: loopback for a job on this
            host. With ``np > 0`` each worker uses the address its executor is known by.
            Defaults to "127.0.0.1".
        output_dir: With ``np > 0``: a folder this process and the executors both reach
            (``s3://...``, ``abfss://...``, a shared mount) where the tasks write their
            workers' output, printed here while they run. Defaults to None: the output goes
            to the executors' logs, and a failed worker's last lines come back with its
            failure.
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
                "MultiWorkerRunner(np=0) runs nothing: use np=-N for N processes on this host "
                "or np=N for N Spark tasks."
            )
        if np < 0:
            check_local_job_address(bind_address)
        self.np = np
        self.start_timeout = start_timeout
        self.stall_timeout = stall_timeout
        self.env = dict(env or {})
        self.bind_address = bind_address
        self.output_dir = output_dir

    def run(self, main: Callable, **kwargs) -> Any:
        """Run ``main(**kwargs)`` on every worker; return what worker 0 returned.

        Raises:
            DistributedError: ``main`` does not pickle, or a worker failed (naming it and the
                cause).
            KerasDLError: A worker raised a keras_dl error: the same class, naming the worker.
            Preempted: The workers stopped on SIGTERM/SIGINT (to them or to this process).
        """
        payload = _check_pickles(main, kwargs)
        env = _rank_env(self.env)
        env.setdefault("KERAS_DL_STALL_TIMEOUT", str(self.stall_timeout))
        host = "127.0.0.1" if self.bind_address == "0.0.0.0" else self.bind_address
        with tempfile.TemporaryDirectory(prefix="keras_dl_mw_") as logs:
            try:
                if self.np > 0:
                    return self._run_spark(payload, env, logs)
                return _run_local(payload, -self.np, host, env, logs)
            except (DistributedError, Preempted):
                raise
            except KerasDLError:
                raise
            except Exception as exc:
                error = explain_failure(exc, logs, size=abs(self.np), engine=MULTIWORKER)
                if isinstance(exc, WorkerFailed) and exc.host not in str(error):
                    error.args = (f"{error.args[0]} Worker {exc.rank} ran on host {exc.host}.",)
                raise error from exc

    def _run_spark(self, payload: bytes, env: dict, logs: str) -> Any:
        from keras_dl.distribute.slots import active_session, wait_for_free_slots
        from keras_dl.launch.spark_workers import run_spark_workers

        # As HorovodRunner: fewer free task slots than np is an error now, not a stage waiting.
        wait_for_free_slots(self.np, timeout=self.start_timeout, settle=10.0)
        return run_spark_workers(
            active_session(), payload, self.np, env, logs, self.output_dir, self.start_timeout
        )


def _run_local(payload: bytes, n: int, host: str, env: dict, logs: str) -> Any:
    """Start ``n`` worker processes, pump their output, stop all when one fails."""
    addresses = [f"{host}:{port}" for port in _free_ports(host, n)]
    folder = Path(logs)
    Path(folder, "payload").write_bytes(payload)  # one for every worker
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    for index in range(n):
        proc = start_module(
            "keras_dl.launch.workers",
            str(folder),
            None,
            worker_env(env, addresses, index),
            die_with_parent=False,
        )
        procs.append(proc)
        out_dir = folder / f"rank.{index}"
        out_dir.mkdir()
        for pipe, name, stream in (
            (proc.stdout, "stdout", sys.stdout),
            (proc.stderr, "stderr", sys.stderr),
        ):
            t = threading.Thread(
                target=pump,
                args=(pipe, f"[{index}]<{name}>:", out_dir / name, stream),
                daemon=True,
            )
            t.start()
            pumps.append(t)
    with _forward_signals(procs):
        failed = _wait(procs)
    for t in pumps:
        t.join(timeout=10)
    if failed is not None:
        index, code = failed
        raise RuntimeError(
            f"A multi-worker process exited with non-zero status. Process name: {index} "
            f"Exit code: {code}"
        )
    import cloudpickle

    return cloudpickle.loads(Path(folder, "result").read_bytes())


def _wait(procs: list[subprocess.Popen]) -> tuple[int, int] | None:
    """Wait for every worker; on the first non-zero exit, kill the others. Returns it or None."""
    first = None
    while any(p.poll() is None for p in procs):
        for index, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0) and first is None:
                first = (index, code)
                # Give the others a moment to stop on their own (a preemption: every worker
                # stops after the same step), then end them: a peer waits in its collectives.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and any(q.poll() is None for q in procs):
                    time.sleep(0.2)
                for q in procs:
                    if q.poll() is None:
                        q.kill()
        time.sleep(0.2)
    if first is None:
        first = next(((i, p.returncode) for i, p in enumerate(procs) if p.returncode), None)
    return first


class _forward_signals:
    """Within the block, SIGTERM/SIGINT to this process are sent on to every worker (which then
    checkpoint and stop after the same step), as Horovod's launcher does for its ranks."""

    def __init__(self, procs):
        self.procs, self.saved = procs, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.saved[sig] = signal.signal(sig, self._forward)
        return self

    def _forward(self, signum, frame):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _free_ports(host: str, n: int) -> list[int]:
    """``n`` ports free on ``host`` now (the kernel's choice; TF binds them a moment later)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _child_main(folder: str) -> None:
    """A worker's process: run ``rank_main`` on the payload; worker 0 writes its result."""
    import cloudpickle

    from keras_dl.launch.rank import rank_main

    result = rank_main(Path(folder, "payload").read_bytes())
    if os.environ.get(RANK) == "0":
        Path(folder, "result").write_bytes(cloudpickle.dumps(result))
        return
    # The others stay until the chief is done (it logs and registers after fit): TF's
    # coordination service on the chief reports a peer that left as a crashed task. The
    # launcher ends this process if the chief fails.
    while not Path(folder, "result").exists():
        time.sleep(0.2)


if __name__ == "__main__":
    _child_main(sys.argv[1])
