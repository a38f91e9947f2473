"""A Spark driver that probes its executors' interfaces: ``python -m
tests.distribute.interfaces_driver MASTER NP``; prints one JSON line with the probes.
It runs in its own process so that its SparkSession cannot clash with other tests' sessions.
"""

from __future__ import annotations

import json
import sys


def main(master: str, np: int) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.distribute.interfaces import check_spark_interfaces, probe_spark_interfaces

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-interfaces")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        check_spark_interfaces(spark.sparkContext, np)  # one host: nothing to refuse
        out = {"probes": probe_spark_interfaces(spark.sparkContext, np)}
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
