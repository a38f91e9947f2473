"""A Spark driver for the cluster test of the ranks' plumbing on a classic session:
``python -m tests.distribute.spark_ranks_driver MASTER TMP``.

A job of two ranks on the standalone cluster, through ``HorovodRunner`` (``horovod.spark.run``):
rank 1 writes its pid to ``TMP/rank1.pid`` after a few collectives and waits to be SIGKILLed
(by the test), while rank 0 sleeps outside any collective (a long validation or checkpoint): only
the launcher can stop it. The driver notes when the job failed, and how.

It prints one JSON line, ``RESULT {...}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(master: str, tmp: str) -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-rank-plumbing")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    out = {}
    try:
        out.update(_killed_rank_job(Path(tmp)))
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


def _killed_rank_job(tmp: Path) -> dict:
    from keras_dl.errors import KerasDLError
    from keras_dl.launch import HorovodRunner

    try:
        HorovodRunner(np=2, stall_timeout=120).run(
            _wait_to_be_killed, pidfile=str(tmp / "rank1.pid")
        )
        error = "no error"
    except KerasDLError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "failed_at": time.time()}


def _wait_to_be_killed(pidfile: str) -> None:
    import os
    import time

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    for _ in range(3):  # training steps' allreduces: both ranks are in the job
        hvd.allreduce(tf.constant(1.0))
    if hvd.rank() == 1:
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
    time.sleep(300)  # rank 0: outside any collective; rank 1: until the test kills it


if __name__ == "__main__":
    main(*sys.argv[1:3])
