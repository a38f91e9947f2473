"""A Spark driver for the cluster test of the ranks' plumbing on a classic session:
``python -m tests.distribute.spark_ranks_driver MASTER TMP``.

Two jobs of two ranks on the standalone cluster, through ``HorovodRunner`` (``horovod.spark.run``):

- each rank prints a line, sleeps, prints another with the time it wrote it; the driver notes
  when it saw each line (its own clock, as each write reaches its ``sys.stdout``);
- rank 1 writes its pid to ``TMP/rank1.pid`` after a few collectives and waits to be SIGKILLed
  (by the test), while rank 0 sleeps outside any collective (a long validation or checkpoint):
  only the launcher can stop it. The driver notes when the job failed, and how.

It prints one JSON line, ``RESULT {...}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PAUSE = 8.0  # seconds between a rank's two lines


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
        out["lines"] = _output_job()
        out.update(_killed_rank_job(Path(tmp)))
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


class _Seen:
    """sys.stdout that notes when each line reached it."""

    def __init__(self, stream):
        self.stream, self.lines = stream, []

    def write(self, text: str) -> int:
        now = time.time()
        self.lines.extend((now, line) for line in text.splitlines() if line)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _output_job() -> list:
    from keras_dl.launch import HorovodRunner

    seen = _Seen(sys.stdout)
    sys.stdout = seen
    try:
        HorovodRunner(np=2).run(_print_sleep_print, pause=PAUSE)
    finally:
        sys.stdout = seen.stream
    return [(t, line) for t, line in seen.lines if "keras_dl-test line" in line]


def _print_sleep_print(pause: float) -> None:
    import os
    import time

    rank = os.environ["HOROVOD_RANK"]
    print(f"keras_dl-test line 1 of rank {rank}", flush=True)
    time.sleep(pause)
    print(f"keras_dl-test line 2 of rank {rank} written at {time.time()}", flush=True)


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
