"""A Spark driver that waits for free task slots: ``python -m tests.distribute.slots_driver MASTER
NP SETTLE``. It prints one JSON line: how long the wait took, and its error (None when the slots
were there)."""

from __future__ import annotations

import json
import sys
import time


def main(master: str, np: int, settle: float) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.distribute.slots import wait_for_free_slots

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-slots")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    out = {}
    began = time.monotonic()
    try:
        wait_for_free_slots(np, timeout=300, settle=settle)
        out["error"] = None
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["waited"] = time.monotonic() - began
        out["ended_at"] = time.time()
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
