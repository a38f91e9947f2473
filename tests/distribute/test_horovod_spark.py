"""Horovod across a real Spark standalone cluster: a master and 2 workers on loopback.

Every scenario runs twice: from a classic session on the master, and from a Spark Connect
session on a Connect server that runs on the same master (started once, after the classic
runs: it holds the cluster's two cores while it lives).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keras_dl.train import TrainResult
from tests.conftest import REPO, SPARK_CLUSTER
from tests.distribute.checks import check_horovod_run
from tests.distribute.conftest import digits_experiment
from tests.fixtures.spark import (
    cluster_env,
    free_port,
    master_command,
    spark_home,
    wait_for_port,
    wait_for_workers,
    worker_command,
)

pytestmark = SPARK_CLUSTER  # see tests/conftest.py


@contextlib.contextmanager
def standalone_cluster(tmp: Path, workers: list[tuple[int, dict]]):
    """Yield ``(spark://127.0.0.1:PORT, env)``: a standalone master on loopback and one worker per
    ``(cores, extra env)`` of ``workers``, each daemon in its own process group, all stopped after."""
    home = spark_home()
    env = cluster_env(home, tmp)
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    daemons = [(master_command(home, "127.0.0.1", port, ui), env)]
    for i, (cores, extra) in enumerate(workers):
        cmd = worker_command(home, master, "127.0.0.1", cores, free_port(), tmp / f"work{i}")
        daemons.append((cmd, {**env, **extra}))
    procs = []
    try:
        for i, (cmd, cmd_env) in enumerate(daemons):
            log = open(tmp / f"daemon{i}.log", "w")  # noqa: SIM115 (closed with the process)
            procs.append(
                subprocess.Popen(
                    cmd, env=cmd_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            if i == 0:
                wait_for_port(port)
        wait_for_workers(ui, len(workers))
        yield master, env
    finally:
        # Stop exactly the daemons started here (each leads its own process group).
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """``spark://127.0.0.1:PORT``: a standalone master and two 1-core workers, stopped after."""
    with standalone_cluster(tmp_path_factory.mktemp("spark"), [(1, {}), (1, {})]) as cluster:
        yield cluster


def _start_connect_server(master: str, env: dict, log_dir: Path) -> tuple[subprocess.Popen, str]:
    """A Spark Connect server on ``master`` (its own driver, with the cluster's 2 cores)."""
    port = free_port()
    home = Path(env["SPARK_HOME"])
    log = open(log_dir / "connect.log", "w")  # noqa: SIM115 (closed with the process)
    cmd = [str(home / "bin" / "spark-submit"), "--master", master, "--class"]
    cmd += ["org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "keras_dl-test"]
    for key, value in {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.executor.cores": "1",
        "spark.executor.memory": "1g",
        # What keras_dl counts the free task slots from on Connect (no view of executors).
        "spark.cores.max": "2",
    }.items():
        cmd += ["--conf", f"{key}={value}"]
    proc = subprocess.Popen(
        [*cmd, "spark-internal"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_port(port, timeout=180)
    return proc, f"sc://127.0.0.1:{port}"


@pytest.fixture(scope="module", params=["classic", "connect"])
def driver_target(request, spark_cluster, tmp_path_factory):
    """What the driver connects to: the master (a classic session) or a Connect server's
    ``sc://`` URL; with the cluster's environment. Module-scoped, so pytest runs every classic
    scenario first, then starts the Connect server once for the Connect ones."""
    master, env = spark_cluster
    if request.param == "classic":
        yield master, env
        return
    proc, url = _start_connect_server(master, env, tmp_path_factory.mktemp("connect"))
    try:
        yield url, env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run_driver(env: dict, *args: str, module: str = "tests.distribute.spark_driver"):
    """Run ``python -m module args`` (a Spark driver): its RESULT and its whole output."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
    except subprocess.TimeoutExpired as exc:  # what it was doing, not a truncated repr
        out, err = (
            x.decode(errors="replace") if isinstance(x, bytes) else x or ""
            for x in (exc.stdout, exc.stderr)
        )
        pytest.fail(
            f"the driver did not end in 400 s; its stdout:\n{out[-4000:]}\nstderr:\n{err[-8000:]}"
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), proc.stdout + proc.stderr


@pytest.mark.slow
def test_two_spark_tasks_train_like_local_ranks_and_too_many_fail_fast(
    driver_target, digits_table, tmp_path
):
    master, env = driver_target
    out, logs = _run_driver(env, master, digits_table, str(tmp_path))
    exp = digits_experiment(digits_table, tmp_path, "runtime.strategy=horovod", "runtime.np=2")
    report = {"result": TrainResult(**out["report"]["result"]), "ranks": out["report"]["ranks"]}
    check_horovod_run(report, exp)
    assert report["result"].metrics["test_accuracy"] > 0.85
    # Output of the Spark tasks came back to the driver, each line prefixed by its task.
    assert "[0]<stderr>:" in logs
    # Three tasks on two slots: a fast, explained refusal instead of a 600 s wait.
    assert re.search(
        r"needs 3 free Spark task slots, but .* has [12] free of [12]", out["too_many"]
    )
    # Refused by the free-slot check, not after runtime.start_timeout (600 s) of waiting; the
    # bound is half that timeout, loose enough for a loaded machine (timings are for benchmarks).
    assert out["too_many_seconds"] < 300
    if master.startswith("sc://"):
        # A rank that raises: named with its cause; the other rank (asleep, in no collective)
        # was stopped through the rendezvous server instead of sleeping on.
        assert out["failure"].startswith("DistributedError: Horovod rank 1 failed: ValueError: "), (
            out
        )
        assert "JVM_ATTRIBUTE_NOT_SUPPORTED" not in logs


@pytest.mark.slow
# Classic only: the settings travel in the task's closure on Connect as on classic, and the
# Connect scenario above already proves a job's round trip (this one cost 70 CPU-s more).
@pytest.mark.parametrize("driver_target", ["classic"], indirect=True)
def test_spark_tasks_read_the_table_and_keep_checkpoints_on_s3(
    driver_target, s3, monkeypatch, tmp_path
):
    import boto3

    from keras_dl.data.ingest.datasets import ingest_sklearn_digits
    from keras_dl.storage import environment

    master, env = driver_target
    assert env.get("AWS_ENDPOINT_URL") != s3.endpoint  # the workers started without it
    table = s3.uri("digits")
    ingest_sklearn_digits(table)
    run_dir = s3.uri("runs/digits")
    # Only the driver gets the object-store settings; they reach the executors with the tasks.
    out, _ = _run_driver({**env, **environment()}, master, table, str(tmp_path), run_dir)
    exp = digits_experiment(
        table, tmp_path, "runtime.strategy=horovod", "runtime.np=2", f"runtime.run_dir={run_dir}"
    )
    report = {"result": TrainResult(**out["report"]["result"]), "ranks": out["report"]["ranks"]}
    check_horovod_run(report, exp)
    listed = boto3.client("s3").list_objects_v2(Bucket=s3.name, Prefix="runs/digits/")
    keys = sorted(o["Key"][len("runs/digits/") :] for o in listed["Contents"])
    assert "config.yaml" in keys and "run.json" in keys and "checkpoints/COMPLETE" in keys
    assert ".lease.json" not in keys  # the driver held the lease for the job and released it
    counted = [k for k in keys if re.fullmatch(r"checkpoints/ckpt-\d{9}\.json", k)]
    assert counted and all(k[:-5] + ".npz" in keys for k in counted), keys
