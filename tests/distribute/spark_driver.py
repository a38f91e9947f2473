"""A Spark driver for the cluster test: ``python -m tests.distribute.spark_driver MASTER TABLE TMP
[RUN_DIR]``.

It connects to the standalone cluster, trains the digits recipe with ``runtime.np=2`` (two Spark
tasks); then, with no active session and ``MASTER`` pointing at the cluster (as the CLI runs),
asks for 3 tasks on the 2-slot cluster. It prints one JSON line with both outcomes. Given a
RUN_DIR (an ``s3://`` URI), it trains there and skips the 3-task check.
A ``MASTER`` of ``sc://HOST:PORT`` makes it a Spark Connect session on that server (and the
3-task check starts its session from ``SPARK_REMOTE``); it then also runs a job whose rank 1
raises while rank 0 sleeps.
It runs in its own process so that its SparkSession cannot clash with other tests' sessions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path


def main(master: str, table: str, tmp: str, run_dir: str = "") -> None:
    from pyspark.sql import SparkSession

    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment
    from tests.distribute.workers import train_and_report

    if master.startswith("sc://"):
        spark = SparkSession.builder.remote(master).getOrCreate()
    else:
        spark = (
            SparkSession.builder.master(master)
            .appName("keras_dl-test-horovod-spark")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "1g")
            .getOrCreate()
        )
    out = {}
    try:
        sets = ["runtime.strategy=horovod", "runtime.np=2"]
        if run_dir:
            sets.append(f"runtime.run_dir={run_dir}")
        exp = digits_experiment(table, Path(tmp), *sets)
        start = time.monotonic()
        report = launch(exp, main=train_and_report)
        out["seconds"] = time.monotonic() - start
        out["report"] = {"result": dataclasses.asdict(report["result"]), "ranks": report["ranks"]}
        if not run_dir and master.startswith("sc://"):
            out["failure"] = _failing_job()
        if not run_dir:
            _too_many(spark, master, table, tmp, out)
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


def _fail_on_rank_1():
    """Rank 1 raises; rank 0 sleeps outside any collective (only the launcher can stop it)."""
    import time

    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    time.sleep(300)


def _failing_job() -> str:
    from keras_dl.errors import KerasDLError
    from keras_dl.launch import HorovodRunner

    try:
        HorovodRunner(np=2).run(_fail_on_rank_1)
    except KerasDLError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _too_many(spark, master: str, table: str, tmp: str, out: dict) -> None:
    from keras_dl.errors import DistributedError
    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment

    too_many = digits_experiment(
        table, Path(tmp) / "too_many", "runtime.strategy=horovod", "runtime.np=3"
    )
    # As from the CLI: no active session, so launch starts one on $MASTER (the cluster).
    spark.stop()
    os.environ["SPARK_REMOTE" if master.startswith("sc://") else "MASTER"] = master
    start = time.monotonic()
    try:
        launch(too_many)
        out["too_many"] = "no error"
    except DistributedError as exc:
        out["too_many"] = str(exc)
    out["too_many_seconds"] = time.monotonic() - start


if __name__ == "__main__":
    main(*sys.argv[1:5])
