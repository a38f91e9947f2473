"""The run folder and the tracking store rank 0 writes to must be the same on every Spark host.

In process: which folders are checked, and the probe's Spark stage (classic and Connect). On a
standalone cluster whose second worker has a private folder (its own mount namespace, a tmpfs
over the folder, its own host name): the check refuses exactly that folder, naming that host.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from keras_dl.launch.shared_storage import check_shared_storage, local_folders, probe_hosts
from tests.conftest import SPARK_CLUSTER

PRIVATE_HOST = "keras-dl-shared-h2"  # the host name of the worker with a private folder


def test_the_local_folders_rank_0_writes_to_are_checked_and_remote_ones_are_not(digits_exp):
    exp = digits_exp("runtime.run_dir=runs/digits", "tracking.uri=sqlite:////data/m/mlflow.db")
    assert local_folders(exp) == {
        "run_dir": ("runtime.run_dir=runs/digits", "runs/digits"),
        "tracking": ("tracking.uri=sqlite:////data/m/mlflow.db", "/data/m"),
        "artifacts": ("the MLflow artifact root file:///data/m/mlartifacts", "/data/m/mlartifacts"),
    }
    exp = digits_exp("tracking.uri=file:///data/mlruns", "tracking.artifact_location=/data/art")
    assert local_folders(exp)["tracking"] == ("tracking.uri=file:///data/mlruns", "/data/mlruns")
    assert local_folders(exp)["artifacts"][1] == "/data/art"
    exp = digits_exp(
        "runtime.run_dir=s3://bucket/runs",
        "tracking.uri=http://mlflow:5000",
        "tracking.artifact_location=s3://bucket/mlflow",
    )
    assert local_folders(exp) == {}
    assert local_folders(digits_exp("tracking.uri=databricks", "runtime.run_dir=s3://b/r")) == {}


@pytest.mark.connect_too
def test_the_probe_reads_each_folders_marker_on_every_task(spark, tmp_path):
    token = secrets.token_hex(8)
    shared, stale = tmp_path / "shared", tmp_path / "stale"
    for folder, content in ((shared, token), (stale, "another job's token")):
        folder.mkdir()
        (folder / "marker").write_text(content)
    folders = {"run_dir": ("runtime.run_dir=...", str(shared)), "tracking": ("...", str(stale))}
    reports = probe_hosts(spark, 2, folders, "marker", token)
    assert [r["task"] for r in reports] == [0, 1]
    for r in reports:  # local[2]: both tasks on this host, as the driver
        assert r["host"] and r["address"]
        assert r["seen"] == {"run_dir": [True, str(shared)], "tracking": [False, str(stale)]}


def test_one_host_and_a_local_master_are_not_probed(digits_exp, spark, tmp_path):
    local = digits_exp("runtime.strategy=horovod", "runtime.np=-2")
    check_shared_storage(spark, local)  # np < 0: one host
    # A local master: every task on this host (no stage runs; no marker is left either way).
    check_shared_storage(spark, digits_exp("runtime.strategy=horovod", "runtime.np=2"))
    assert not list(tmp_path.rglob(".keras_dl-shared-check-*"))


@pytest.fixture(scope="module")
def private_folder_cluster(tmp_path_factory):
    """``(master, env, tmp, private)``: a standalone master and two 1-core workers on loopback;
    the second in its own mount and UTS namespaces (host name PRIVATE_HOST) with a tmpfs over
    ``private``: a folder that exists on both, but is not the same folder."""
    from tests.distribute.test_horovod_spark import standalone_cluster

    tmp = tmp_path_factory.mktemp("private_cluster")
    private = tmp / "private"
    private.mkdir()
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("a worker in its own mount namespace needs root (CI runs as root)")
    script = f'hostname {PRIVATE_HOST} && mount -t tmpfs tmpfs "{private}" && exec "$@"'
    hidden = ["unshare", "--mount", "--uts", "sh", "-c", script, "sh"]
    with standalone_cluster(tmp, [(1, {}), (1, {}, hidden)]) as (master, env):
        yield master, env, tmp, private


@pytest.mark.slow
@SPARK_CLUSTER
def test_a_folder_one_host_does_not_share_is_refused_naming_that_host(private_folder_cluster):
    from tests.warm_python import REAL_PYTHON

    master, env, tmp, private = private_folder_cluster
    # The executors' Python workers run the real interpreter: the suite's warm one forks them
    # from its server, which runs outside the second worker's namespaces (tests/warm_python.py).
    env = {**env, "PYSPARK_PYTHON": REAL_PYTHON}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.distribute.shared_storage_driver", master, str(tmp)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    # The probe's two tasks ran one on each worker, each in its own working directory.
    assert sorted(r["host"] for r in out["reports"]) == sorted(
        [socket.gethostname(), PRIVATE_HOST]
    ), out
    # Folders both workers share (the loopback cluster's filesystem): the check passes.
    assert out["shared"] == "passed", out
    # The run folder in the second worker's private folder: refused, naming it and that host
    # only; the tracking store and its artifacts, which both hosts share, are not named.
    text = out["private"]
    assert text.startswith("ConfigError: runtime.np=2: rank 0 runs on whichever host"), text
    assert f"runtime.run_dir={private / 'run'} is not the same folder on every host" in text
    assert f"host {PRIVATE_HOST} (127.0.0.1) did not find it in {private / 'run'}" in text
    assert text.count("did not find it") == 1 and "tracking.uri" not in text
    assert "runtime.run_dir=s3://BUCKET/PATH or abfss://" in text
    assert not list(Path(private).rglob(".keras_dl-shared-check-*"))  # the marker is removed
    # A relative run folder is another folder in each Spark task's working directory.
    text = out["relative"]
    assert "runtime.run_dir=runs/digits is not the same folder on every host" in text, text
    assert text.count("did not find it in ") == 2 and f"host {PRIVATE_HOST} " in text
    assert f"{tmp / 'work0'}/" in text  # where the first worker's task looked
