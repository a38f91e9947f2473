"""runtime.strategy=multiworker with np=2 on a real Spark standalone cluster (a master and two
1-core workers on loopback): MultiWorkerRunner runs one TF worker per barrier task."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import SPARK_CLUSTER

# The loopback cluster (a master and two 1-core workers), one per module, and its driver runner.
from tests.distribute.test_horovod_spark import _run_driver, spark_cluster  # noqa: F401

pytestmark = SPARK_CLUSTER  # see tests/conftest.py


@pytest.fixture(scope="module")
def driver_run(spark_cluster, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """The driver's RESULT, its output and its folder: both jobs, one driver process."""
    master, env = spark_cluster
    tmp = tmp_path_factory.mktemp("multiworker")
    out, log = _run_driver(
        env, master, str(tmp), module="tests.distribute.multiworker_spark_driver"
    )
    return out, log, tmp


@pytest.mark.slow
def test_two_barrier_tasks_run_one_worker_each_and_return_worker_0s_value(driver_run):
    out, _, tmp = driver_run
    seen = [json.loads((tmp / f"worker.{i}.json").read_text()) for i in (0, 1)]
    addresses = seen[0]["tf_config"]["cluster"]["worker"]
    assert len(addresses) == 2 and len(set(addresses)) == 2, seen
    for index, worker in enumerate(seen):
        assert worker["tf_config"] == {
            "cluster": {"worker": addresses},
            "task": {"type": "worker", "index": index},
        }
        assert worker["replicas"] == 2
    assert all(a.startswith("127.0.0.1:") for a in addresses)  # the executors' address
    assert out["result"] == seen[0]  # worker 0's return value, not worker 1's
    assert seen[0]["pid"] != seen[1]["pid"]


@pytest.mark.slow
def test_with_an_output_dir_a_workers_output_reaches_the_driver_while_it_runs(driver_run):
    out, log, _ = driver_run
    live = out["live"]
    # The workers wait (up to 120 s) until the driver printed worker 0's line: it came live.
    assert live["seen_after"] is not None, log[-4000:]
    assert live["result"] is True, live
    assert live["leftover"] == [], live  # the driver deleted what the tasks wrote
    print(f"worker 0's first line printed {live['seen_after']:.1f} s after the job started")


@pytest.mark.slow
def test_a_worker_raising_fails_the_job_naming_its_rank_host_and_cause(driver_run):
    out, log, _ = driver_run
    failure = out["failure"]
    print(f"the failure, {out['failure_seconds']:.1f} s after the job started: {failure}")
    assert failure is not None, log[-4000:]
    assert failure.startswith("DistributedError: "), failure
    assert re.search(r"Worker 1\b.*worker 1 fails on purpose", failure, re.S), failure
    assert "on host 127.0.0.1" in failure, failure  # the failed worker's host
    assert "The other workers were stopped." in failure, failure
    # Worker 0 slept for 300 s outside any collective: the barrier stage's end stopped it.
    assert out["failure_seconds"] < 120, out


@pytest.mark.slow
def test_a_killed_worker_fails_the_job_naming_its_rank_host_and_signal(driver_run):
    out, log, _ = driver_run
    killed = out["killed"]
    print(f"the failure, {out['killed_seconds']:.1f} s after the job started: {killed}")
    assert killed is not None, log[-4000:]
    assert re.search(r"^DistributedError: Worker 1 died: killed by signal 9 \(SIGKILL\)", killed)
    assert "host 127.0.0.1" in killed, killed
    assert out["killed_seconds"] < 120, out
