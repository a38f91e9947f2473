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

import json
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from keras_dl.errors import DistributedError
from keras_dl.launch.child import start_module

RANK = "KERAS_DL_RANK"  # a worker's index, for its failure report (TF_CONFIG holds it too)
_REPORT = "keras_dl-worker-failed "  # starts a failed task's report in its error (one JSON line)
_TAIL = 200  # lines of each stream a failed worker's report carries to the driver
_LINE = 4000  # characters of each of those lines


class WorkerFailed(RuntimeError):
    """A worker of a Spark job exited non-zero: in Horovod's words, for ``explain_failure``."""

    def __init__(self, rank: int, host: str, code: int):
        super().__init__(
            f"A multi-worker process exited with non-zero status. Process name: {rank} "
            f"Exit code: {code}"
        )
        self.rank, self.host, self.code = rank, host, code


def tf_config(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of ``addresses`` (``host:port``)."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def worker_env(env: dict, addresses: list[str], index: int) -> dict:
    """The environment of worker ``index``: this process's, ``env``, its ``TF_CONFIG`` and rank."""
    return {**os.environ, **env, "TF_CONFIG": tf_config(addresses, index), RANK: str(index)}


def pump(stream, prefix: str, copy: Path, out) -> None:
    """Write each line of ``stream`` to ``out`` and to the file ``copy``, prefixed."""
    with open(copy, "w") as kept:
        for line in stream:
            text = f"{prefix}{line if line.endswith(chr(10)) else line + chr(10)}"
            kept.write(text)
            kept.flush()
            out.write(text)
            out.flush()


def run_spark_workers(spark, payload: bytes, np: int, env: dict, logs: str) -> Any:
    """Run ``rank_main(payload)`` on ``np`` barrier tasks of ``spark``; return worker 0's result.

    Raises:
        WorkerFailed: A worker exited non-zero; its output is copied to ``logs/rank.R``.
        DistributedError: The session is Spark Connect, or the stage failed before a worker ran.
    """
    import cloudpickle

    if not hasattr(spark, "sparkContext") or _is_connect(spark):
        raise DistributedError(
            f"runtime.strategy=multiworker with runtime.np={np} needs a classic SparkSession "
            "(its sparkContext runs the barrier stage); this is a Spark Connect session. Use "
            "runtime.strategy=horovod on Spark Connect, or runtime.np=-N on this host."
        )
    sc = spark.sparkContext
    task = _task_function(payload, env)
    try:
        rows = sc.parallelize(range(np), np).barrier().mapPartitions(task).collect()
    except Exception as exc:
        report = failure_report(str(exc))
        if report is None:
            raise DistributedError(
                f"The Spark barrier stage of the {np} multi-worker tasks failed before a worker "
                f"reported: {type(exc).__name__}: {_first_lines(str(exc))} Check the executors' "
                "logs, and that their Python (PYSPARK_PYTHON) has keras_dl's dependencies."
            ) from None
        _keep_output(report, logs)
        raise WorkerFailed(report["rank"], report["host"], report["code"]) from None
    return cloudpickle.loads(rows[0])


def failure_report(text: str) -> dict | None:
    """The first failed worker's report in a Spark error's text, or None."""
    at = text.find(_REPORT)
    if at < 0:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(text, at + len(_REPORT))
    except ValueError:
        return None
    return report


def _keep_output(report: dict, logs: str) -> None:
    """Copy the failed worker's last lines to ``logs/rank.R`` and print them here."""
    folder = Path(logs, f"rank.{report['rank']}")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("stdout", "stderr"):
        lines = report.get(name, [])
        Path(folder, name).write_text("".join(lines))
        (sys.stdout if name == "stdout" else sys.stderr).write("".join(lines))
    sys.stdout.flush()
    sys.stderr.flush()


def _first_lines(text: str, n: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:n])


def _is_connect(spark) -> bool:
    from keras_dl.connect import is_connect

    return is_connect(spark)


def _task_function(payload: bytes, env: dict):
    """The function each barrier task runs (pickled to the executors)."""

    def task(_partition):
        from pyspark import BarrierTaskContext

        result = _run_worker_in_task(BarrierTaskContext.get(), payload, env)
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


def _run_worker_in_task(ctx, payload: bytes, env: dict) -> bytes | None:
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
                target=pump, args=(pipe, f"[{rank}]<{name}>:", folder / name, stream), daemon=True
            )
            for pipe, name, stream in (
                (proc.stdout, "stdout", sys.stdout),
                (proc.stderr, "stderr", sys.stderr),
            )
        ]
        for t in pumps:
            t.start()
        if rank != 0:
            # The worker stays until the chief's worker is done (it waits for "result"): the
            # chief's task enters the barrier only then.
            threading.Thread(target=_release_after_chief, args=(ctx, folder), daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join(timeout=10)
        if code != 0:
            raise RuntimeError(_report_text(rank, host, code, folder))
        if rank != 0:
            return None
        result = Path(folder, "result").read_bytes()
    ctx.barrier()  # the chief's worker is done: the other workers may end
    return result


def _release_after_chief(ctx, folder: Path) -> None:
    ctx.barrier()
    Path(folder, "result").write_bytes(b"")


def _report_text(rank: int, host: str, code: int, folder: Path) -> str:
    """A failed task's error: the words, then its report as one JSON line for the driver."""
    report: dict = {"rank": rank, "host": host, "code": code}
    for name in ("stdout", "stderr"):
        path = folder / name
        lines = path.read_text(errors="replace").splitlines(keepends=True) if path.exists() else []
        report[name] = [
            line if len(line) <= _LINE else line[:_LINE] + " ...\n" for line in lines[-_TAIL:]
        ]
    return (
        f"Multi-worker worker {rank} on host {host} exited with status {code}.\n"
        f"{_REPORT}{json.dumps(report)}"
    )
