"""The store outlives the process: a run killed in one process resumes, by run_id, in another,
on the same Delta table (named by its rows, never rewritten); and the store may be on S3."""

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

from tests.conftest import REPO

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


def test_a_store_on_s3_holds_the_data_and_is_reused(s3, iris, mlflow_uri, monkeypatch):
    import shutil
    import tempfile

    import pyarrow.fs as pafs
    from pyspark.ml.feature import VectorAssembler

    from keras_dl.data import open_table
    from keras_dl.errors import DataError
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
    with pytest.raises(DataError, match="AWS_S3_ALLOW_UNSAFE_RENAME=true"):
        est.fit(df)  # a Delta commit on S3 needs a lock, or the promise of one writer
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")  # this test is the only writer
    first = est.fit(df)
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
    # The run folder is local for now (runtime.run_dir is a path), named after the store.
    local = Path(tempfile.gettempdir()) / "keras_dl_runs" / "s3" / s3.name
    try:
        runs = local / "experiments" / "iris_store" / "runs"
        assert [json.loads(p.read_text())["run_id"] for p in runs.glob("*/run.json")] == [
            first.getRunId()
        ]
        assert list(runs.glob("*/checkpoints/*"))
        # A second fit of the same rows finds the table on S3 and writes nothing.
        second = est.setEpochs(1).fit(df)
        assert client.get_run(second.getRunId()).data.tags["data.table"] == table
        again = fs.get_file_info(pafs.FileSelector(root, recursive=True))
        assert {i.path: i.mtime_ns for i in again} == mtimes
        assert second.transform(df).count() == 150
    finally:
        shutil.rmtree(local, ignore_errors=True)
