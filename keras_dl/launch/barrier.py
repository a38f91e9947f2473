"""Horovod ranks as the tasks of one Spark barrier stage, through DataFrame APIs only.

This is how :class:`~keras_dl.launch.runner.HorovodRunner` runs ``np > 0`` on a Spark Connect
session (no sparkContext), the way pyspark's TorchDistributor does since Spark 3.5:
``spark.range(np).mapInPandas(task, barrier=True)``. Each task is one rank. Rank 0's task starts
Horovod's Gloo rendezvous server and the tasks share its address with
``BarrierTaskContext.allGather``, so the client only submits the stage: it need not be reachable
from the executors (Databricks serverless). Each task runs its rank in a child process (as
torchrun does under TorchDistributor), so a rank that crashes or is killed is an exit status.
A rank that fails tells the others through the rendezvous server's key-value store, and their
tasks stop their ranks; every task then returns its rank's exit status and output, and the
driver explains the failure as for the other launchers (:mod:`keras_dl.distribute.failures`).
While the stage runs, the tasks also write their output to a folder the driver reads, which
prints it and applies ``start_timeout`` (:mod:`keras_dl.launch.rank_output`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from keras_dl import storage
from keras_dl.launch.child import start_module
from keras_dl.launch.rank_output import (
    RankOutputTail,
    RankOutputWriter,
    collect_watched,
    output_folder,
)

_SCHEMA = "rank int, code int, stopped boolean, result binary, output string"
_ABORT_SCOPE = "keras_dl_failed"  # set by a failed rank's task, polled by the others
# A failed rank's PUT there: 5 attempts, 0.25 s after the first failure doubling to 2 s (3.75 s
# of waits, each attempt at most 5 s): the other ranks poll it once a second.
_PUT_ATTEMPTS = 5
_PUT_FIRST_DELAY = 0.25
_PUT_TIMEOUT = 5

log = logging.getLogger(__name__)


def run_barrier(
    spark,
    payload: bytes,
    np: int,
    env: dict,
    logs: str,
    start_timeout: float = 120,
    output_dir: str | None = None,
) -> list:
    """Run ``rank_main(payload)`` on ``np`` barrier tasks; return the ranks' results.

    Each rank's output comes back prefixed ``[rank]<stdout>:`` / ``[rank]<stderr>:``; it is
    printed here while the stage runs and kept in ``logs`` (for
    :func:`~keras_dl.distribute.failures.explain_failure`). The tasks write it to a new
    folder under ``output_dir`` (one the executors reach; see
    :func:`~keras_dl.launch.rank_output.output_folder` when it is None), read here every half
    second.

    Raises:
        RuntimeError: When a rank exited non-zero, in Horovod's words ("Process name: R
            Exit code: C"), for ``explain_failure`` to name the rank and its cause.
        DistributedError: When the ranks did not all start within ``start_timeout`` seconds.
    """
    import cloudpickle

    folder = output_folder(spark, output_dir, logs)
    task = _task_function(payload, env, folder, storage.environment())
    df = spark.range(0, np, 1, np).mapInPandas(task, schema=_SCHEMA, barrier=True)
    if folder is None:
        rows = df.collect()
    else:
        tail = RankOutputTail(folder)
        try:
            rows = collect_watched(spark, df, np, tail, start_timeout)
        except BaseException:
            Path(logs, "spark.out").write_text("".join(tail.text))
            raise
        finally:
            tail.remove()
    rows = sorted(rows, key=lambda r: r.rank)
    _check_rows(rows, logs, printed=folder is not None)
    return [cloudpickle.loads(r.result) if r.result else None for r in rows]


def _check_rows(rows: list, logs: str, printed: bool) -> None:
    """Keep the ranks' output (rows in rank order) in ``logs``; print it unless ``printed``
    already (live); raise if a rank failed.

    A failed rank's row carries its exit status and its whole output, its failure report
    included, whether or not it could tell the other ranks (:func:`_put`): this is what the
    driver explains the failure from.

    Raises:
        RuntimeError: In Horovod's words ("Process name: R Exit code: C"): the first rank, in
            rank order, that failed on its own (not stopped by its task).
    """
    with open(Path(logs) / "spark.out", "w") as copy:
        for row in rows:
            if not printed:
                sys.stdout.write(row.output)
            copy.write(row.output)
    sys.stdout.flush()
    failed = [r for r in rows if r.code != 0]
    if failed:
        first = next((r for r in failed if not r.stopped), failed[0])
        raise RuntimeError(
            f"Horovod detected that one or more processes exited with non-zero status. "
            f"Process name: {first.rank} Exit code: {first.code}"
        )


def _task_function(payload: bytes, env: dict, folder: str | None, store_env: dict):
    """The function each barrier task runs (pickled to the executors)."""

    def task(batches):
        import pandas as pd
        from pyspark import BarrierTaskContext

        for _ in batches:  # one row per task; the stage needs its input consumed
            pass
        ctx = BarrierTaskContext.get()
        if folder is not None:
            storage.use_environment(store_env)  # the driver's object-store settings
        row = _run_rank_in_task(ctx, payload, env, folder)
        yield pd.DataFrame([row])

    return task


def _run_rank_in_task(ctx, payload: bytes, env: dict, folder: str | None) -> dict:
    """On an executor: rendezvous, run this task's rank in a child process, return its row."""
    rank = ctx.partitionId()
    writer = None
    if folder is not None:
        writer = RankOutputWriter(folder, rank)
        writer.start()
    hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
    server = None
    port = ""
    if rank == 0:
        server, port = _start_rendezvous(hosts)
    try:
        addr, port = hosts[0], int(ctx.allGather(str(port))[0])
        rank_env = {**os.environ, **env, **_rank_env_in_task(ctx, hosts, addr, port)}
        code, stopped, result, output = _run_child(rank, payload, rank_env, (addr, port), writer)
        if writer is not None:
            writer.close()  # before the barrier: the driver has every line when the stage ends
        ctx.barrier()  # rank 0's rendezvous server stays up until every rank has ended
    finally:
        if writer is not None:
            writer.close()
        if server is not None:
            server.stop()
    return {"rank": rank, "code": code, "stopped": stopped, "result": result, "output": output}


def _start_rendezvous(hosts: list[str]):
    """Rank 0: Horovod's Gloo rendezvous server for ``hosts`` (one per rank), and its port."""
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(_slot_plan(hosts))
    return server, port


def _slot_plan(hosts: list[str]) -> list:
    """Horovod's ``SlotInfo`` of every rank: rank i on ``hosts[i]``, local ranks per host in task
    order, cross ranks in the order hosts first appear (as ``get_host_assignments`` numbers them)."""
    from horovod.runner.common.util.hosts import SlotInfo

    local_rank = [hosts[:i].count(h) for i, h in enumerate(hosts)]

    def peers(i: int) -> list[str]:  # the hosts that hold a rank with local rank local_rank[i]
        return list(dict.fromkeys(h for h, r in zip(hosts, local_rank) if r == local_rank[i]))

    return [
        SlotInfo(
            hostname=h,
            rank=i,
            local_rank=local_rank[i],
            cross_rank=peers(i).index(h),
            size=len(hosts),
            local_size=hosts.count(h),
            cross_size=len(peers(i)),
        )
        for i, h in enumerate(hosts)
    ]


def _rank_env_in_task(ctx, hosts: list[str], addr: str, port: int) -> dict:
    """The Horovod environment of this barrier task's rank, as ``horovod.runner.gloo_run``
    sets it: the rendezvous server, rank, size, local and cross ranks, Gloo controller."""
    from keras_dl.distribute.gpus import child_env

    slot = _slot_plan(hosts)[ctx.partitionId()]
    env = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }
    iface = _interface_of(slot.hostname)
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    env.update(child_env())  # the GPUs Spark gave this task, if any (CUDA_VISIBLE_DEVICES)
    return env


def _interface_of(address: str) -> str | None:
    """The network interface holding ``address`` on this host (Gloo binds it), if any."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


def _run_child(rank: int, payload: bytes, env: dict, server: tuple[str, int], writer=None):
    """Run the rank in ``python -m keras_dl.launch.barrier``; stop it if another rank failed.

    Returns ``(exit code, stopped here, pickled result, prefixed output)``.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="keras_dl_rank_") as tmp:
        proc = start_module("keras_dl.launch.barrier", tmp, payload, env, die_with_parent=True)
        lines: list[str] = []
        pumps = [
            threading.Thread(target=_pump, args=(pipe, f"[{rank}]<{name}>:", lines, out, writer))
            for pipe, name, out in (
                (proc.stdout, "stdout", sys.stdout),
                (proc.stderr, "stderr", sys.stderr),
            )
        ]
        for t in pumps:
            t.start()
        stopped = False
        while proc.poll() is None:
            time.sleep(1.0)
            if proc.poll() is None and _someone_failed(server):
                proc.kill()  # not SIGTERM: keras_dl takes that for a preemption
                stopped = True
        code = proc.wait()
        for t in pumps:
            t.join()
        if code != 0 and not stopped:
            error = _put(server, "first", f"{rank} {code}")
            if error is not None:  # in this rank's output: the driver gets it with the row
                note = (
                    f"[{rank}]<stderr>:keras_dl: rank {rank} (exit status {code}) could not "
                    f"tell the other ranks it failed: {error}. They stop when a collective "
                    "with it fails, or after runtime.stall_timeout; the driver still gets this "
                    "rank's exit status and output with its task's result.\n"
                )
                log.warning("%s", note.split(":", 1)[1].strip())
                lines.append(note)
                if writer is not None:
                    writer.add(note)
                sys.stderr.write(note)
        result = Path(tmp, "result").read_bytes() if Path(tmp, "result").exists() else b""
    return code, stopped, result, "".join(lines)


def _pump(stream, prefix: str, lines: list, out, writer) -> None:
    for line in stream:
        text = f"{prefix}{line if line.endswith(chr(10)) else line + chr(10)}"
        lines.append(text)
        if writer is not None:
            writer.add(text)
        out.write(text)
        out.flush()


def _url(server: tuple[str, int], key: str) -> str:
    return f"http://{server[0]}:{server[1]}/{_ABORT_SCOPE}/{key}"


def _put(server: tuple[str, int], key: str, value: str) -> str | None:
    """Store ``value`` under ``key`` in the rendezvous server's key-value store, retrying with
    a bounded backoff (a server busy or restarting answers 503, or refuses the connection).

    Returns:
        None once stored; else what the last attempt got, naming the URL (the other ranks then
        stop only on their own: a collective with the failed peer fails, or the stall timeout).
    """
    url = _url(server, key)
    delay = _PUT_FIRST_DELAY
    for attempt in range(1, _PUT_ATTEMPTS + 1):
        request = urllib.request.Request(url, data=value.encode(), method="PUT")
        try:
            urllib.request.urlopen(request, timeout=_PUT_TIMEOUT).close()
            return None
        except OSError as exc:  # HTTPError (503, ...), URLError (refused, reset), timeout
            error = exc
        if attempt < _PUT_ATTEMPTS:
            time.sleep(delay)
            delay *= 2
    return f"PUT {url} failed {_PUT_ATTEMPTS} times, last with {type(error).__name__}: {error}"


def _someone_failed(server: tuple[str, int]) -> bool:
    """Whether a rank has reported its failure to the rendezvous server's key-value store."""
    try:
        urllib.request.urlopen(_url(server, "first"), timeout=5).close()
        return True
    except OSError:  # 404 (HTTPError): no rank has failed; or the server is gone
        return False


def _child_main(folder: str) -> None:
    """The rank's process: run ``rank_main`` on the payload, write rank 0's result."""
    import cloudpickle

    from keras_dl.launch.rank import rank_main

    result = rank_main(Path(folder, "payload").read_bytes())
    if os.environ.get("HOROVOD_RANK") == "0":
        Path(folder, "result").write_bytes(cloudpickle.dumps(result))


if __name__ == "__main__":
    _child_main(sys.argv[1])
