"""A Spark driver for the multi-worker cluster test:
``python -m tests.distribute.multiworker_spark_driver MASTER TMP``.

It connects to the standalone cluster and runs ``MultiWorkerRunner(np=2)`` three times: a function
that creates the strategy and reports the ``TF_CONFIG`` it saw (each worker writes a file under
TMP: the cluster's workers share this host), then one whose worker 1 raises and one whose
worker 1 is SIGKILLed, while worker 0 sleeps outside any collective (only the end of the stage
can stop it). It prints one JSON line.
It runs in its own process so that its SparkSession cannot clash with other tests' sessions.
"""

from __future__ import annotations

import json
import sys
import time


def report_tf_config(folder: str) -> dict:
    """Create the strategy; write and return this worker's ``TF_CONFIG`` and replica count."""
    import json
    import os
    from pathlib import Path

    from keras_dl.distribute import multiworker

    strategy = multiworker.init()
    config = json.loads(os.environ["TF_CONFIG"])
    seen = {"tf_config": config, "replicas": strategy.num_replicas_in_sync, "pid": os.getpid()}
    Path(folder, f"worker.{config['task']['index']}.json").write_text(json.dumps(seen))
    return seen


def fail_on_worker_1() -> None:
    import json
    import os
    import time

    from keras_dl.distribute import multiworker

    multiworker.init()
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
        raise ValueError("worker 1 fails on purpose")
    time.sleep(300)


def kill_worker_1() -> None:
    """Worker 1 dies by SIGKILL (no report of its own); worker 0 sleeps."""
    import json
    import os
    import signal
    import time

    from keras_dl.distribute import multiworker

    multiworker.init()
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)


def main(master: str, tmp: str) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.errors import KerasDLError
    from keras_dl.launch import MultiWorkerRunner

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-multiworker-spark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    out: dict = {}
    try:
        start = time.monotonic()
        out["result"] = MultiWorkerRunner(np=2).run(report_tf_config, folder=tmp)
        out["seconds"] = time.monotonic() - start
        for key, fn in (("failure", fail_on_worker_1), ("killed", kill_worker_1)):
            start = time.monotonic()
            try:
                MultiWorkerRunner(np=2).run(fn)
                out[key] = None
            except KerasDLError as exc:
                out[key] = f"{type(exc).__name__}: {exc}"
            out[f"{key}_seconds"] = time.monotonic() - start
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
