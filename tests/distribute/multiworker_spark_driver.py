"""A Spark driver for the multi-worker cluster test:
``python -m tests.distribute.multiworker_spark_driver MASTER TMP``.

It connects to the standalone cluster and runs ``MultiWorkerRunner(np=2)`` four times: a function
that creates the strategy and reports the ``TF_CONFIG`` it saw (each worker writes a file under
TMP: the cluster's workers share this host), one whose workers print a line and wait until the
driver printed it (an ``output_dir``), then one whose worker 1 raises and one whose
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


class _Recorded:
    """This process's stdout, recorded too."""

    def __init__(self, stream):
        self.stream, self.text = stream, []

    def write(self, text: str) -> int:
        self.text.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def live_output(tmp: str) -> dict:
    """A job with an ``output_dir``: how long worker 0's line took to be printed here, while
    the workers wait for it (they end only once it was seen), and what the job returned."""
    import os
    import threading

    from keras_dl.launch import MultiWorkerRunner
    from tests.distribute.print_wait import MARKER, print_then_wait

    recorded = _Recorded(sys.stdout)
    sys.stdout = recorded
    outcome: dict = {}
    runner = MultiWorkerRunner(np=2, output_dir=os.path.join(tmp, "worker-output"))

    def job() -> None:
        try:
            outcome["result"] = runner.run(print_then_wait, folder=tmp)
        except Exception as exc:
            outcome["result"] = f"{type(exc).__name__}: {exc}"

    start = time.monotonic()
    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    seen = None
    while thread.is_alive() and time.monotonic() - start < 150:
        if any(f"[0]<stdout>:{MARKER}" in t for t in recorded.text):
            seen = time.monotonic() - start
            break
        time.sleep(0.2)
    open(os.path.join(tmp, "go"), "w").close()
    thread.join(150)
    sys.stdout = recorded.stream
    leftover = os.listdir(os.path.join(tmp, "worker-output"))
    return {"seen_after": seen, "result": outcome.get("result"), "leftover": leftover}


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
        out["live"] = live_output(tmp)
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
