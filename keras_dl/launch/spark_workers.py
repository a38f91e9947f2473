"""The workers of TF's MultiWorkerMirroredStrategy as the tasks of one Spark barrier stage.

This is how :class:`~keras_dl.launch.workers.MultiWorkerRunner` runs ``np > 0``, the way
spark-tensorflow-distributor's ``MirroredStrategyRunner`` does:
``sc.parallelize(range(np), np).barrier().mapPartitions(task)``, one worker per task. Each task
takes the host its executor is known by (``BarrierTaskContext.getTaskInfos()``), reserves a free
port on that address, shares ``host:port`` with the other tasks (``allGather``), and runs its
worker (index = partition id; worker 0 is the chief) with that ``TF_CONFIG`` in a child process,
``python -m keras_dl.launch.workers`` as on the local path, streaming its output to the task's
stdout prefixed ``[rank]<stdout>:``. The other workers stay until the chief is done (a barrier
after the chief's worker ended); the chief's pickled result is the stage's only row.

A worker that exits non-zero fails its task; barrier semantics end the other tasks (and their
workers die with them), and the task's error carries the worker's rank, host, exit status and
last lines to the driver, which explains it as for the local path
(:func:`~keras_dl.distribute.failures.explain_failure`).

The port is reserved on the executor's address, then released just before the worker starts.
TensorFlow's gRPC server listens on it on every interface (0.0.0.0 is hard-coded in
``grpc_server_lib.cc``); the other workers reach it at the executor's address.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from keras_dl import storage
from keras_dl.errors import DistributedError
from keras_dl.launch.child import start_module
from keras_dl.launch.rank_output import RankOutputTail, RankOutputWriter
from keras_dl.launch.stage_start import POLL_SECONDS, collect_started
from keras_dl.launch.worker_report import (
    WorkerFailed,
    failed_report,
    failure_report,
    first_lines,
    keep_output,
    lost_peer,
    lost_store,
    report_text,
    stopped_for_peer,
)
from keras_dl.launch.worker_stop import StopWatch, stop_on_signal

RANK = "KERAS_DL_RANK"  # a worker's index, for its failure report (TF_CONFIG holds it too)
# A worker that stopped because of a peer fails its task this many seconds late, so the peer's
# own report (its cause) reaches the driver first when the peer's task still runs: the first
# failed task's error is the one Spark gives the driver, and a failed barrier task ends the
# others' (this one's wait with them).
PEER_GRACE = 10.0
FAILED_FLUSH = 3.0  # seconds a failed task gives its last output lines to reach the store


def tf_config(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of ``addresses`` (``host:port``)."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def worker_env(env: dict, addresses: list[str], index: int) -> dict:
    """The environment of worker ``index``: this process's, ``env``, its ``TF_CONFIG`` and rank."""
    return {**os.environ, **env, "TF_CONFIG": tf_config(addresses, index), RANK: str(index)}


def pump(stream, prefix: str, copy: Path, out, live=None) -> None:
    """Write each line of ``stream`` to ``out`` and to the file ``copy``, prefixed (and give it
    to ``live``, a :class:`~keras_dl.launch.rank_output.RankOutputWriter`, when there is one)."""
    with open(copy, "w") as kept:
        for line in stream:
            text = f"{prefix}{line if line.endswith(chr(10)) else line + chr(10)}"
            kept.write(text)
            kept.flush()
            out.write(text)
            out.flush()
            if live is not None:
                live.add(text)


def run_spark_workers(
    spark,
    payload: bytes,
    np: int,
    env: dict,
    logs: str,
    output_dir: str | None = None,
    start_timeout: float = 120,
) -> Any:
    """Run ``rank_main(payload)`` on ``np`` barrier tasks of ``spark``; return worker 0's result.

    With ``output_dir`` (a folder this process and the executors both reach: the run folder's
    ``rank-output``), each worker's lines are printed here while it runs, as Horovod's ranks'
    are (:mod:`keras_dl.launch.rank_output`); without it they reach the executors' logs, and a
    failed worker's last lines come back with its task's failure.

    The stage's tasks must all start within ``start_timeout`` seconds
    (:mod:`keras_dl.launch.stage_start`): another job may take the free slots the launcher saw.

    Raises:
        WorkerFailed: A worker exited non-zero; its output is copied to ``logs/rank.R``.
        DistributedError: The session is Spark Connect, the tasks did not all start within
            ``start_timeout`` (the stage was cancelled), or the stage failed before a worker ran.
    """
    import cloudpickle

    if not hasattr(spark, "sparkContext") or _is_connect(spark):
        raise DistributedError(
            f"runtime.strategy=multiworker with runtime.np={np} needs a classic SparkSession "
            "(its sparkContext runs the barrier stage); this is a Spark Connect session. Use "
            "runtime.strategy=horovod on Spark Connect, or runtime.np=-N on this host."
        )
    sc = spark.sparkContext
    folder = None if output_dir is None else storage.join(str(output_dir), uuid.uuid4().hex)
    task = _task_function(payload, env, folder, storage.environment())
    try:
        with _printed_live(folder), stop_on_signal(folder):
            stage = sc.parallelize(range(np), np).barrier().mapPartitions(task)
            rows = collect_started(sc, stage, np, start_timeout, "multi-worker workers")
    except DistributedError:
        raise
    except Exception as exc:
        report = failure_report(str(exc))
        if report is None:
            raise DistributedError(
                f"The Spark barrier stage of the {np} multi-worker tasks failed before a worker "
                f"reported: {type(exc).__name__}: {first_lines(str(exc))} Check the executors' "
                "logs, and that their Python (PYSPARK_PYTHON) has keras_dl's dependencies."
            ) from None
        keep_output(report, logs, printed=folder is not None)
        lost = lost_peer(report, float(env.get("KERAS_DL_STALL_TIMEOUT") or 0))
        if lost is not None:
            raise lost from None
        raise WorkerFailed(report["rank"], report["host"], report["code"]) from None
    return cloudpickle.loads(rows[0])


@contextlib.contextmanager
def _printed_live(folder: str | None):
    """Within the block, print every new output file the tasks write to ``folder``."""
    if folder is None:
        yield
        return
    tail = RankOutputTail(folder)
    done = threading.Event()

    def poll() -> None:
        while not done.wait(POLL_SECONDS):
            tail.poll()

    thread = threading.Thread(target=poll, daemon=True, name="keras_dl-worker-output")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        tail.poll()  # the lines written after the last poll
        tail.remove()


def _is_connect(spark) -> bool:
    from keras_dl.connect import is_connect

    return is_connect(spark)


def _task_function(payload: bytes, env: dict, folder: str | None, store_env: dict):
    """The function each barrier task runs (pickled to the executors)."""

    def task(_partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        writer = None
        if folder is not None:
            storage.use_environment(store_env)  # the driver's object-store settings
            writer = RankOutputWriter(folder, ctx.partitionId())
            writer.start()
        try:
            result = _run_worker_in_task(ctx, payload, env, writer)
        except BaseException:
            if writer is not None:
                writer.close(timeout=FAILED_FLUSH)
            raise
        if writer is not None:
            writer.close()
        if result is not None:
            yield result

    return task


def executor_host(ctx) -> str:
    """The address this task's executor is known by (the host of its ``host:port``)."""
    address = ctx.getTaskInfos()[ctx.partitionId()].address
    return address.rsplit(":", 1)[0].strip("[]")


def _reserve_port(host: str, rank: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        s.bind((host, 0))
    except OSError as exc:
        s.close()
        raise RuntimeError(
            f"Multi-worker task {rank} could not bind a port on {host}, the address its Spark "
            f"executor is known by: {exc}. Start the executor with SPARK_LOCAL_IP (or "
            "spark.executor.host) set to an address of its host the other hosts reach."
        ) from None
    return s


def _run_worker_in_task(ctx, payload: bytes, env: dict, writer=None) -> bytes | None:
    """On an executor: agree on the cluster, run this task's worker, return the chief's result."""
    from keras_dl.distribute.gpus import child_env

    rank = ctx.partitionId()
    host = executor_host(ctx)
    with _reserve_port(host, rank) as reserved:
        addresses = ctx.allGather(f"{host}:{reserved.getsockname()[1]}")
    # With the GPUs Spark gave this task, if any.
    env = {**worker_env(env, addresses, rank), **child_env()}
    with tempfile.TemporaryDirectory(prefix="keras_dl_mw_") as tmp:
        folder = Path(tmp)
        # A killed task (the stage ended) ends its worker.
        proc = start_module("keras_dl.launch.workers", tmp, payload, env, die_with_parent=True)
        pumps = [
            threading.Thread(
                target=pump,
                args=(pipe, f"[{rank}]<{name}>:", folder / name, stream, writer),
                daemon=True,
            )
            for pipe, name, stream in (
                (proc.stdout, "stdout", sys.stdout),
                (proc.stderr, "stderr", sys.stderr),
            )
        ]
        for t in pumps:
            t.start()
        # SIGTERM/SIGINT to the driver reach the worker as a SIGTERM (a preemption).
        watch = StopWatch(writer.folder, rank, proc) if writer is not None else None
        if rank != 0:
            # The worker stays until the chief's worker is done (it waits for "result"): the
            # chief's task enters the barrier only then.
            threading.Thread(target=_release_after_chief, args=(ctx, folder), daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join(timeout=10)
        report = None if code == 0 else failed_report(rank, host, code, folder, addresses)
        if watch is not None:  # after a preemption: the chief's checkpoint is written first
            watch.ended(code, store_lost=report is not None and lost_store(report))
        if report is not None:
            if stopped_for_peer(report):
                time.sleep(PEER_GRACE)  # the peer's own report first, if its task still runs
            raise RuntimeError(report_text(report))
        if rank != 0:
            return None
        result = Path(folder, "result").read_bytes()
    ctx.barrier()  # the chief's worker is done: the other workers may end
    return result


def _release_after_chief(ctx, folder: Path) -> None:
    ctx.barrier()
    Path(folder, "result").write_bytes(b"")
