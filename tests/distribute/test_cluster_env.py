"""The loopback cluster's environment leaves out the suite's own Spark Connect session.

A Connect test leaves the session's token and pyspark's Connect switch in the worker's
``os.environ``; a cluster started later on the same worker inherited them, and its driver's
Connect client then spoke TLS to the cluster's plaintext server until the driver's 400 s ran out.
Which test runs first on a worker is the schedule's choice, so the cluster's own test shows the
defect only sometimes: this one builds the cluster's environment after a Connect test's setup.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.spark import cluster_env


@pytest.mark.connect_only
def test_the_cluster_env_has_nothing_of_the_suites_connect_session(spark, connect_url, tmp_path):
    left_by_connect = {n: os.environ[n] for n in os.environ if n.startswith("SPARK_CONNECT_")}
    assert set(left_by_connect) >= {
        "SPARK_CONNECT_AUTHENTICATE_TOKEN",
        "SPARK_CONNECT_MODE_ENABLED",
    }, "the suite's Connect session no longer sets what this test removes: update it"

    env = cluster_env(Path("/spark-home"), tmp_path)

    assert not [n for n in env if n.startswith("SPARK_CONNECT_")]
    assert left_by_connect["SPARK_CONNECT_AUTHENTICATE_TOKEN"] not in env.values()
    assert env["SPARK_HOME"] == "/spark-home" and env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_the_cluster_env_keeps_the_rest_of_the_callers():
    caller = {"PATH": "/usr/bin", "JDK_JAVA_OPTIONS": "-Xshare:auto", "CUDA_VISIBLE_DEVICES": "0"}
    caller["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = "secret"

    env = cluster_env(Path("/spark-home"), Path("/logs"), caller)

    assert env["PATH"] == "/usr/bin" and env["JDK_JAVA_OPTIONS"] == "-Xshare:auto"
    assert env["SPARK_LOG_DIR"] == "/logs"
    assert "SPARK_CONNECT_AUTHENTICATE_TOKEN" not in env and "CUDA_VISIBLE_DEVICES" not in env
    assert caller["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == "secret"  # the caller's own is untouched
