"""A Spark driver for the resume test: ``python -m tests.distribute.spark_resume_driver MASTER
TABLE TMP``.

It trains the digits recipe as a ``HorovodRunner(np=2)`` job (two Spark tasks of the standalone
cluster) that rank 1's SIGTERM stops inside epoch 2, then reruns it with ``np=1`` (one Spark
task), which resumes the checkpoint. It prints one JSON line: how the first job ended and the
MLflow run id. Its own process, so its SparkSession cannot clash with other tests' sessions.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path


def main(master: str, table: str, tmp: str) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.errors import Preempted
    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment
    from tests.distribute.workers import train_and_report, train_for_weights

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-resume-other-ranks")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    out = {}
    sets = ("runtime.strategy=horovod", "train.epochs=3", "train.batch_size=12")
    try:
        first = digits_experiment(table, Path(tmp), *sets, "runtime.np=2")
        stamp = str(Path(tmp) / "sigterm_sent")
        try:
            launch(first, functools.partial(train_for_weights, sigterm_at=(1, 3), stamp=stamp))
            out["first"] = "finished"
        except Preempted as exc:
            out["first"] = f"preempted at {exc.global_step}"
        report = launch(
            digits_experiment(table, Path(tmp), *sets, "runtime.np=1"), train_and_report
        )
        out["run_id"] = report["result"].run_id
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
