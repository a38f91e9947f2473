"""The store outlives the process: a run killed in one process resumes, by run_id, in another,
on the same Delta table (named by its rows, never rewritten); and the store, data and run
folders, may be on S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from keras_dl import storage
from tests.conftest import HEAVY_IO, REPO

# On the classic session only: the store on S3 is the same on both kinds of session
# (test_estimator and test_tuning_and_resume run fit on Spark Connect too).
pytestmark = pytest.mark.slow


def _fresh_fit(store: Path, uri: str, *args: str) -> subprocess.CompletedProcess:
    """``tests.spark.fresh_fit`` in a new Python process (its own SparkSession and MLflow)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MLFLOW_TRACKING_URI": uri,
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.fresh_fit", str(store), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: what it leaves behind is ended below
    )
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a JVM the killed driver may have left
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _table_files(table: str) -> dict[str, int]:
    """{file name: mtime in ns} of the table's Parquet files and Delta log."""
    root = Path(table)
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if p.is_file() and (p.suffix in (".parquet", ".json"))
    }


@HEAVY_IO
def test_a_killed_fit_resumes_its_mlflow_run_from_a_new_process(tmp_path, mlflow_uri):
    store = tmp_path / "store"
    killed = _fresh_fit(store, mlflow_uri, "--kill-after-epoch", "1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    client = mlflow.MlflowClient(mlflow_uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "RUNNING"  # killed: nothing ended it
    table = run.data.tags["data.table"]
    assert table.startswith(str(store / "data"))
    assert (Path(table) / "_delta_log" / "00000000000000000000.json").exists()
    before = _table_files(table)
    assert any(name.endswith(".parquet") for name in before)

    resumed_at = time.time() * 1000
    resumed = _fresh_fit(store, mlflow_uri, "--run-id", run.info.run_id)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["run_id"] == run.info.run_id  # the same MLflow run, continued
    assert result["table"] == table  # the same rows found the same table...
    assert _table_files(table) == before  # ...and it was not written again
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    for metric in ("loss", "val_loss", "val_accuracy"):
        history = client.get_metric_history(run.info.run_id, metric)
        assert sorted(m.step for m in history) == [0, 1, 2, 3], metric  # each epoch once
        # Epoch 0 came from the killed process, 2 and 3 from the new one: it resumed from the
        # checkpoint instead of training again from the start.
        when = {m.step: m.timestamp for m in history}
        assert when[0] < resumed_at < min(when[2], when[3]), (metric, when, resumed_at)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1  # no second run was started


def _objects(s3, prefix: str) -> dict[str, int]:
    """{key under ``prefix``: size} of the bucket's objects, listed by boto3."""
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2")
    return {
        o["Key"][len(prefix) :]: o["Size"]
        for page in pages.paginate(Bucket=s3.name, Prefix=prefix)
        for o in page.get("Contents", [])
    }


def _local_runs_of(s3) -> Path:
    """Where the run folders of an S3 store were kept before they moved to the store."""
    import tempfile

    return Path(tempfile.gettempdir()) / "keras_dl_runs" / "s3" / s3.name


def test_a_store_on_s3_holds_the_data_and_the_runs_and_is_reused(s3, iris, mlflow_uri, monkeypatch):
    import pyarrow.fs as pafs
    from pyspark.ml.feature import VectorAssembler

    from keras_dl.data import open_table
    from keras_dl.errors import ConfigError, DataError
    from keras_dl.spark import KerasEstimator
    from keras_dl.storage import filesystem
    from tests.spark.conftest import make_model

    df = VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="x").transform(iris)
    store = s3.uri("experiments/iris_store")
    est = KerasEstimator(
        model=make_model(),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        feature_cols=["x"],
        label_cols="label",
        validation=0.2,
        batch_size=30,
        epochs=2,
        store=store,
        experiment=["callbacks.plots=false", "tracking.log_model=false"],
    )
    # deltalake 1.x commits to S3 with conditional writes and needs no lock; it dropped the
    # DynamoDB lock, so a user who asks for it is told, before anything is written.
    monkeypatch.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")
    with pytest.raises(DataError, match="AWS_S3_LOCKING_PROVIDER"):
        est.fit(df)
    assert _objects(s3, "experiments/") == {}
    monkeypatch.delenv("AWS_S3_LOCKING_PROVIDER")
    first = est.fit(df)  # no lock and no AWS_S3_ALLOW_UNSAFE_RENAME
    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(first.getRunId())
    assert run.info.status == "FINISHED"
    table = run.data.tags["data.table"]
    assert table.startswith(store + "/data/")
    snapshot = open_table(table)
    assert snapshot.version == 0 and all(f.startswith("s3://") for f in snapshot.files)
    fs, root = filesystem(table)
    listed = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    assert sum(1 for i in listed if i.path.endswith(".parquet")) == len(snapshot.files) >= 2
    mtimes = {i.path: i.mtime_ns for i in listed}
    # The run folder is on the store: run.json, config.yaml, checkpoints with their manifests,
    # COMPLETE; the lease is released; nothing was kept on this machine.
    runs = _objects(s3, "experiments/iris_store/runs/")
    (folder,) = {key.split("/", 1)[0] for key in runs}
    record = json.loads(storage.read_file(f"{store}/runs/{folder}/run.json"))
    assert record["run_id"] == first.getRunId()
    names = {k.split("/", 1)[1] for k in runs}
    assert {"run.json", "config.yaml", "checkpoints/COMPLETE"} <= names, names
    ckpts = [n for n in names if n.startswith("checkpoints/ckpt-") and n.endswith(".npz")]
    assert ckpts and all(n.removesuffix(".npz") + ".json" in names for n in ckpts), names
    assert f"{folder}/.lease.json" not in runs
    assert not _local_runs_of(s3).exists()
    # A second fit of the same rows finds the table on S3 and writes nothing to it.
    second = est.setEpochs(1).fit(df)
    assert client.get_run(second.getRunId()).data.tags["data.table"] == table
    again = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    assert {i.path: i.mtime_ns for i in again} == mtimes
    assert second.transform(df).count() == 150
    folders = {k.split("/", 1)[0] for k in _objects(s3, "experiments/iris_store/runs/")}
    assert len(folders) == 2 and folder in folders  # a run folder of its own
    # A run id no folder on the store belongs to is refused, naming the store's runs.
    with pytest.raises(ConfigError, match=f"run_id='{'0' * 32}'.*{store}/runs"):
        est.setRunId("0" * 32).fit(df)


def test_the_horovod_hand_off_models_round_trip_through_s3(s3):
    """With run_dir on S3, the driver and the ranks (maybe on other machines) pass the source
    and trained models as .keras objects there."""
    import numpy as np

    from keras_dl.spark.training import load_model, save_model
    from tests.spark.conftest import make_model

    model = make_model()
    uri = s3.uri("store/runs/abc/source_model.keras")
    save_model(model, uri)
    assert _objects(s3, "store/runs/abc/")["source_model.keras"] > 0
    loaded = load_model(uri)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@HEAVY_IO
def test_a_run_killed_with_its_store_on_s3_resumes_from_a_new_process(s3, mlflow_uri):
    import boto3

    store = s3.uri("team/store")
    lease = ["--set", "runtime.lease_seconds=6"]  # the killed run's lease lapses soon
    killed = _fresh_fit(store, mlflow_uri, "--kill-after-epoch", "1", *lease)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    client = mlflow.MlflowClient(mlflow_uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "RUNNING"
    runs = _objects(s3, "team/store/runs/")
    (folder,) = {key.split("/", 1)[0] for key in runs}
    assert f"{folder}/run.json" in runs and f"{folder}/.lease.json" in runs  # left by the dead
    assert any(k.startswith(f"{folder}/checkpoints/") and k.endswith(".json") for k in runs)
    assert not _local_runs_of(s3).exists()
    # Wait out the dead holder's lease (the new process could otherwise start within it).
    body = boto3.client("s3").get_object(
        Bucket=s3.name, Key=f"team/store/runs/{folder}/.lease.json"
    )
    time.sleep(max(0.0, json.loads(body["Body"].read())["expires"] - time.time()) + 0.5)

    resumed_at = time.time() * 1000
    resumed = _fresh_fit(store, mlflow_uri, "--run-id", run.info.run_id, *lease)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["run_id"] == run.info.run_id
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
    when = {m.step: m.timestamp for m in history}
    assert when[0] < resumed_at < min(when[2], when[3]), (when, resumed_at)  # resumed
    after = _objects(s3, "team/store/runs/")
    assert {k.split("/", 1)[0] for k in after} == {folder}  # the same folder, no new one
    assert f"{folder}/checkpoints/COMPLETE" in after and f"{folder}/.lease.json" not in after
    runs_now = [
        r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
    ]
    assert len(runs_now) == 1
