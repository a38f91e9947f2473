"""A Spark driver for the shared-storage test: ``python -m tests.distribute.shared_storage_driver
MASTER TMP``, run with TMP as its working directory.

On the cluster at MASTER (its second worker sees TMP/private as a private folder), it runs the
shared-storage check of a ``runtime.np=2`` job three times: with every folder in TMP (shared),
with the run folder in TMP/private, and with a relative run folder. It prints one JSON line
with each outcome: "passed" or the error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(master: str, tmp: str) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.distribute.slots import wait_for_free_slots
    from keras_dl.launch.shared_storage import check_shared_storage, probe_hosts
    from tests.distribute.conftest import digits_experiment

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-shared-storage")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    out = {}
    try:
        wait_for_free_slots(2, timeout=120, settle=10)
        # Where the probe's two tasks land, and what each sees of the private folder.
        out["reports"] = probe_hosts(
            spark, 2, {"private": ("", str(Path(tmp, "private")))}, "x", ""
        )
        sets = ["runtime.strategy=horovod", "runtime.np=2"]
        runs = {
            "shared": [],
            "private": [f"runtime.run_dir={Path(tmp, 'private', 'run')}"],
            "relative": ["runtime.run_dir=runs/digits"],
        }
        for name, extra in runs.items():
            exp = digits_experiment("unused-table", Path(tmp), *sets, *extra)
            try:
                check_shared_storage(spark, exp)
                out[name] = "passed"
            except Exception as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
