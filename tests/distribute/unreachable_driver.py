"""A Spark driver whose advertised address its executors cannot reach: ``python -m
tests.distribute.unreachable_driver MASTER``.

It binds 127.0.0.1 and advertises 127.0.0.2 (``spark.driver.host``), where nothing listens: an
executor's connection back is refused at once, and nothing leaves the machine. It asks for as
many free task slots as the cluster has workers, and prints one JSON line with the error.
It runs in its own process so that its SparkSession cannot clash with other tests' sessions.
"""

from __future__ import annotations

import json
import sys


def main(master: str, np: int) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.distribute.slots import wait_for_free_slots

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-unreachable-driver")
        .config("spark.driver.host", "127.0.0.2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    out = {"port": spark.sparkContext.getConf().get("spark.driver.port")}
    try:
        wait_for_free_slots(np, timeout=60, settle=10)
        out["error"] = None
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
