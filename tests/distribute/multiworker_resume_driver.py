"""A Spark driver for the multi-worker preemption test:
``python -m tests.distribute.multiworker_resume_driver MASTER TABLE TMP``.

It trains the digits recipe with ``runtime.strategy=multiworker`` on two Spark tasks of the
standalone cluster three times in one MLflow run: SIGTERM to worker 1 inside epoch 2 (an
executor being decommissioned), then SIGTERM to this driver process once the next
checkpoint is written (a scheduler stopping the job), then a rerun on one task, which
resumes. It prints one JSON line: how each job ended and the MLflow run id. Its own process,
so its SparkSession cannot clash with other tests' sessions.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def _sigterm_me_after_a_new_checkpoint(folder: Path, timeout: float = 240) -> None:
    """SIGTERM to this process once ``folder`` holds a checkpoint it did not hold now."""
    before = set(folder.glob("*.json"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(folder.glob("*.json")) - before:
            time.sleep(0.5)  # into the next epoch
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(0.2)


def main(master: str, table: str, tmp: str) -> None:
    from pyspark.sql import SparkSession

    from keras_dl.errors import Preempted
    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment
    from tests.distribute.workers import train_with_fault

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-multiworker-resume")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    out: dict = {}
    sets = ("runtime.strategy=multiworker", "train.epochs=4", "train.batch_size=12")
    two = digits_experiment(table, Path(tmp), *sets, "runtime.np=2")
    try:
        worker_stop = functools.partial(
            train_with_fault, mode="sigterm", rank=1, epoch=1, batch=3, stamp=f"{tmp}/s"
        )
        for leg, main_fn in (("worker", worker_stop), ("driver", None)):
            if main_fn is None:
                folder = Path(tmp, "run", "checkpoints")
                threading.Thread(
                    target=_sigterm_me_after_a_new_checkpoint, args=(folder,), daemon=True
                ).start()
                main_fn = functools.partial(train_with_fault, mode="none", rank=9)
            start = time.monotonic()
            try:
                launch(two, main_fn)
                out[leg] = "finished"
            except Preempted as exc:
                out[leg] = f"preempted by {exc.signal_name} at {exc.global_step}"
            out[f"{leg}_seconds"] = time.monotonic() - start
        one = digits_experiment(table, Path(tmp), *sets, "runtime.np=1")
        launch(one, functools.partial(train_with_fault, mode="none", rank=9))
        out["rerun"] = "finished"
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
