"""GPUs from Spark's resources: each Horovod rank, each scoring task and each tuning trial run as
a Spark task sees only its task's GPUs.

A standalone master and one 2-core worker on loopback whose GPU discovery script reports the
addresses "0" and "1" (no real GPU needed: Spark schedules the addresses, CUDA is never asked).
The app asks for 2 GPUs per executor and 1 per task, so the two concurrent tasks get one each.
The driver runs in its own process (``python -m tests.distribute.test_spark_gpus MASTER OUT``)
so that its SparkSession cannot clash with the suite's local one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import SPARK_CLUSTER
from tests.distribute.test_horovod_spark import _run_driver, standalone_cluster

DISCOVERY = '#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n'


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    """``(master URL, env)``: a master and one 2-core worker with 2 (discovered) GPUs, stopped after."""
    tmp = tmp_path_factory.mktemp("spark_gpus")
    script = tmp / "discover_gpus.sh"
    script.write_text(DISCOVERY)
    script.chmod(0o755)
    gpus = {
        "SPARK_WORKER_OPTS": "-Dspark.worker.resource.gpu.amount=2 "
        f"-Dspark.worker.resource.gpu.discoveryScript={script}",
    }
    with standalone_cluster(tmp, [(2, gpus)]) as cluster:
        yield cluster


@pytest.mark.slow
@SPARK_CLUSTER
def test_each_rank_scoring_task_and_tuning_trial_sees_only_its_tasks_gpu(gpu_cluster, tmp_path):
    master, env = gpu_cluster
    out, _ = _run_driver(env, master, str(tmp_path), module="tests.distribute.test_spark_gpus")

    ranks = sorted(out["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    # Each rank ran for a task that Spark gave exactly one GPU, the two tasks different ones...
    assert all(len(r["task_gpus"]) == 1 for r in ranks), ranks
    assert sorted(r["task_gpus"][0] for r in ranks) == ["0", "1"], ranks
    # ...and sees exactly that one: CUDA_VISIBLE_DEVICES is its task's address, not its local
    # rank's, and Horovod's pinning takes the first (only) visible GPU.
    for r in ranks:
        assert r["visible"] == r["task_gpus"][0], ranks
        assert r["gpu_index"] == 0, ranks

    tasks = out["scoring"]
    assert len(tasks) == 4 and all(t["scored"] == 2 for t in tasks), tasks
    for t in tasks:  # every scoring task, whichever Python worker ran it
        assert len(t["task_gpus"]) == 1 and t["visible"] == t["task_gpus"][0], tasks
        # What a launcher hands a child process of the task: the same GPU, marked as Spark's.
        mark = {"CUDA_VISIBLE_DEVICES": t["visible"], "KERAS_DL_SPARK_GPUS": t["visible"]}
        assert t["child_env"] == mark, tasks

    # keras-dl tune with 2 trials, 2 at a time: two Spark tasks, one GPU each, each trial's run
    # tagged with the one GPU its task was given (issue 35's seam: trials took none).
    assert out["trials"] == ["0", "1"], out["trials"]


@pytest.mark.connect_too
def test_without_gpu_resources_the_environment_is_left_alone(spark, monkeypatch):
    from keras_dl.distribute import gpus, horovod

    # The driver (no Spark task): nothing to take, nothing changed.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.delenv(gpus.FROM_SPARK, raising=False)
    assert gpus.task_gpu_addresses() == [] and gpus.use_task_gpus() == {}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and horovod.gpu_index(3) == 3

    # A Spark task of a session without GPU scheduling: its environment stays as it was.
    def probe(batches):
        import os

        import pandas as pd

        from keras_dl.distribute.gpus import child_env, task_gpu_addresses, use_task_gpus

        for _ in batches:
            os.environ["CUDA_VISIBLE_DEVICES"] = "as-set-by-the-user"
            found = task_gpu_addresses() or child_env()
            applied = use_task_gpus()
            visible = os.environ["CUDA_VISIBLE_DEVICES"]
            yield pd.DataFrame({"found": [len(found)], "applied": [len(applied)], "v": [visible]})

    rows = spark.range(2, numPartitions=2).mapInPandas(probe, "found int, applied int, v string")
    assert [tuple(r) for r in rows.collect()] == [(0, 0, "as-set-by-the-user")] * 2


def test_a_rank_given_its_tasks_gpus_pins_the_first_visible_one(monkeypatch):
    from keras_dl.distribute import horovod

    # A child of a Spark task given GPUs 1 and 3 (gpus.child_env): local rank 1 trains on the
    # task's first GPU (as Horovod's get_available_devices()[0]), not on visible GPU number 1.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.setenv("KERAS_DL_SPARK_GPUS", "1,3")
    assert horovod.gpu_index(1) == 0
    # The user changed the visible GPUs afterwards: they are no longer Spark's, local rank rules.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert horovod.gpu_index(1) == 1


# -- the driver, run in its own process --------------------------------------------------------


def _report_rank(out_dir: str) -> None:
    """Every rank: what its task was given, what it sees, and which visible GPU it pins."""
    import json
    import os

    from horovod.spark.task import get_available_devices

    from keras_dl.distribute import horovod as khvd

    hvd = khvd.init()
    report = {
        "rank": hvd.rank(),
        "local_rank": hvd.local_rank(),
        "task_gpus": [str(a) for a in get_available_devices()],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_index": khvd.gpu_index(hvd.local_rank()),
    }
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(report, f)


def _score_and_report(model_file: str):
    """A ``mapInPandas`` body: score with keras_dl's executor, report the task's GPUs and env."""

    def body(batches):
        import os

        import numpy as np
        import pandas as pd
        from pyspark import TaskContext

        from keras_dl.distribute.gpus import child_env
        from keras_dl.inference.executor import load_scorer

        scored = 0
        for pdf in batches:
            score = load_scorer(model_file, keras_flavor=True)
            scored += len(score(np.stack(pdf["x"].to_numpy()).astype("float32")))
        gpu = TaskContext.get().resources().get("gpu")
        yield pd.DataFrame(
            {
                "task_gpus": [json.dumps(list(gpu.addresses) if gpu else [])],
                "visible": [os.environ.get("CUDA_VISIBLE_DEVICES")],
                "scored": [scored],
                "child_env": [json.dumps(child_env())],
            }
        )

    return body


def main(master: str, out_dir: str) -> None:
    import keras
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from keras_dl.launch import HorovodRunner

    spark = (
        SparkSession.builder.master(master)
        .appName("keras_dl-test-spark-gpus")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "2")
        .config("spark.executor.memory", "1g")
        .config("spark.executor.resource.gpu.amount", "2")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )
    out = {}
    try:
        # First, while Spark's Python workers are fresh: a reused worker keeps the environment
        # an earlier task of this app set (a scoring task's GPU), which would hide the seam.
        out["trials"] = _tune_two_trials(Path(out_dir))
        HorovodRunner(np=2, start_timeout=300).run(_report_rank, out_dir=out_dir)
        out["ranks"] = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*"))]

        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.save(Path(out_dir) / "model.keras")
        spark.sparkContext.addFile(str(Path(out_dir) / "model.keras"))
        x = F.col("id").cast("double")
        rows = spark.range(8, numPartitions=4).select(F.array(x, x, x).alias("x"))
        scored = rows.mapInPandas(
            _score_and_report("model.keras"),
            "task_gpus string, visible string, scored int, child_env string",
        )
        out["scoring"] = [
            {
                "task_gpus": json.loads(r.task_gpus),
                "visible": r.visible,
                "scored": r.scored,
                "child_env": json.loads(r.child_env),
            }
            for r in scored.collect()
        ]
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


def _tune_two_trials(tmp: Path) -> list[str]:
    """``keras-dl tune digits`` with 2 one-epoch trials at a time on the active session: the
    GPU tag of each trial's run, sorted."""
    import mlflow

    from keras_dl.config import resolve
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits
    from keras_dl.recipe import load_recipe
    from keras_dl.tuning.space import parse_space
    from keras_dl.tuning.study import tune
    from keras_dl.tuning.trial import GPUS_TAG, TRIAL_TAG

    table = str(tmp / "digits")
    ingest_sklearn_digits(table)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    sets = {
        "data.table": table,
        "tracking.uri": uri,
        "runtime.run_dir": str(tmp / "run"),
        "train.epochs": "1",
        "train.verbose": "0",
        "callbacks.plots": "false",
        "tracking.log_model": "false",
        "tune.trials": "2",
        "tune.parallelism": "2",
    }
    exp = resolve(load_recipe("digits").defaults, sets=[f"{k}={v}" for k, v in sets.items()])
    tune(exp, parse_space(["train.learning_rate=loguniform(1e-3,3e-2)"]))
    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = [r for r in client.search_runs(experiments) if TRIAL_TAG in r.data.tags]
    return sorted(r.data.tags.get(GPUS_TAG, "none") for r in runs)


if __name__ == "__main__":
    main(*sys.argv[1:3])
