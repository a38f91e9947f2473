"""What the suite's warm interpreter (tests/warm_python_server.py) serves and what it sends cold:
a command it serves must start as the real interpreter would start it."""

import os
import subprocess
import sys

import pytest

from tests import warm_python_server as server


@pytest.fixture
def mine(monkeypatch):
    """The server's environment, as tests/warm_python.py starts it."""
    monkeypatch.setenv("PYTHONPATH", "/repo")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    return {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}


def test_spark_s_own_variables_and_its_hash_seed_are_served(mine):
    assert server.refusal(mine) is None
    spark = {
        **mine,
        "PYTHONHASHSEED": "0",  # what Spark gives its Python workers
        "PYTHON_WORKER_FACTORY_SECRET": "f21b7527",  # Spark's, read when used
        "PYTHON_UDF_BATCH_SIZE": "100",
        "PYTHONDONTWRITEBYTECODE": "1",  # set in the child as sys.dont_write_bytecode
        "PYTHONUNBUFFERED": "YES",
    }
    assert server.refusal(spark) is None


def test_a_path_of_pyspark_s_own_zips_is_served_and_another_path_is_not(mine):
    lib = os.path.join(server.PYSPARK, "python", "lib")
    daemon = f"{lib}/pyspark.zip:{lib}/py4j-0.10.9.9-src.zip:{server.PYSPARK}/jars/spark-core.jar"
    assert server.refusal({**mine, "PYTHONPATH": daemon}) is None
    assert server.refusal({**mine, "PYTHONPATH": f"{daemon}:/repo"}) is None
    other = f"/elsewhere/pyspark.zip:{daemon}"
    assert server.refusal({**mine, "PYTHONPATH": other}) == f"PYTHONPATH {other!r}"
    escaped = f"{server.PYSPARK}/../numpy"  # inside by its name, outside once resolved
    assert server.refusal({**mine, "PYTHONPATH": escaped}) == f"PYTHONPATH {escaped!r}"


def test_what_cpython_or_a_library_reads_at_import_is_sent_cold(mine):
    assert server.refusal({**mine, "PYTHONHASHSEED": "42"}) == "PYTHONHASHSEED '42'"
    assert server.refusal({**mine, "PYTHONHASHSEED": "random"}) == "PYTHONHASHSEED 'random'"
    for name in (
        "PYTHONWARNINGS",
        "PYTHONOPTIMIZE",
        "TF_CPP_MIN_LOG_LEVEL",
        "CUDA_VISIBLE_DEVICES",
    ):
        why = server.refusal({**mine, name: "x"})
        assert why == f"import-time variables differ: {name}", why


LEADER = """
import os, subprocess, sys
print(os.getpid(), os.getpgrp(), sys.executable, sys.argv[1:])
sys.stdout.flush()
subprocess.run([sys.executable, "-c", "import os; print(os.getpid(), os.getppid())"], check=True)
"""


def test_a_group_leader_runs_cold_and_its_python_subprocesses_warm():
    """A command leading its own group is the real process the test signals (its pid, its
    group), and what it starts with ``sys.executable`` forks from the server."""
    if os.environ.get("KERAS_DL_COLD_PYTHON"):
        pytest.skip("no warm interpreter in this run")
    out = subprocess.run(
        [sys.executable, "-c", LEADER, "an", "argument"],
        capture_output=True, text=True, timeout=120, start_new_session=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (pid, group, executable, argv), (child, parent) = [
        line.split(" ", 3) for line in out.stdout.splitlines()
    ]
    assert pid == group  # the leader itself: the test's signals to its group reach it
    assert executable == sys.executable and argv == "['an', 'argument']"
    assert parent != pid and child != pid
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        assert b"tests.warm_python_server" in f.read()  # forked by the warm server
