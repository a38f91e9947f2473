"""Shared fixtures: real Delta tables on disk, a real SQLite-backed MLflow in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def digits_table(tmp_path_factory) -> str:
    """scikit-learn's digits as a Delta table partitioned by split (written once per session)."""
    from keras_dl.data.ingest import ingest_sklearn_digits

    path = str(tmp_path_factory.mktemp("tables") / "digits")
    ingest_sklearn_digits(path)
    return path


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh SQLite tracking store; fails the test if it leaks an active run."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    leaked = mlflow.active_run()
    if leaked is not None:
        mlflow.end_run()
        pytest.fail(f"test leaked an active MLflow run {leaked.info.run_id}")


def run_cli(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 600):
    """Run ``keras-dl ARGS`` (or ``python -m ...`` when args start with -m) in a subprocess."""
    cmd = (
        [sys.executable, *args]
        if args[0] == "-m"
        else [sys.executable, "-m", "keras_dl.cli", *args]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def runs_in(uri: str):
    """Every run of every experiment in the store at ``uri``."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps) if exps else []


def train_digits(table: str, tmp: Path, *sets: str):
    """Train the digits recipe on ``table`` with ``sets`` overrides, tracked in a fresh SQLite
    store under ``tmp``. Returns ``(experiment, TrainResult, tracking_uri)``."""
    import mlflow

    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    recipe = load_recipe("digits")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp / 'run'}",
            "train.verbose=0",
            *sets,
        ],
    )
    result = fit(exp, recipe)
    assert mlflow.active_run() is None
    return exp, result, uri


@pytest.fixture(scope="session")
def digits_model(digits_table, tmp_path_factory):
    """The digits recipe trained briefly and registered as ``digits`` version 1 in its own
    SQLite store (once per session). Returns ``(tracking_uri, TrainResult)``."""
    tmp = tmp_path_factory.mktemp("digits_model")
    _, result, uri = train_digits(digits_table, tmp, "train.epochs=4")
    assert result.registered_version == 1
    return uri, result


def write_delta(path, table, rows_per_group, rows_per_file=None, partition_by=None, mode="error"):
    """Write ``table`` as a Delta table with row groups of ``rows_per_group`` rows.

    deltalake 1.x writes with delta-rs, which cuts files by bytes, not rows (its pyarrow engine's
    ``max_rows_per_file`` went with 1.0). For files of ``rows_per_file`` rows each slice is its
    own commit (append), so the table's version is the number of files minus one.
    """
    from deltalake import write_deltalake

    from keras_dl.storage import delta_row_group_options

    step = rows_per_file or max(table.num_rows, 1)
    for start in range(0, max(table.num_rows, 1), step):
        write_deltalake(
            path,
            table.slice(start, step),
            partition_by=partition_by,
            mode=mode if start == 0 else "append",
            **delta_row_group_options(rows_per_group),
        )
    return path


# petastorm_files: this many files, row groups per file and rows per row group.
PETASTORM_FILES = (5, 4, 10)


@pytest.fixture(scope="session")
def petastorm_files(tmp_path_factory) -> list[str]:
    """Parquet files of ids 0, 1, ... in order (columns id, x = id / 2, name = f"n{id}").

    Named in reverse of the order given, so a sorted listing would read them wrongly.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files, groups, rows = PETASTORM_FILES
    root = tmp_path_factory.mktemp("petastorm_files")
    paths = []
    for k in range(files):
        ids = np.arange(k * groups * rows, (k + 1) * groups * rows)
        table = pa.table({"id": ids, "x": ids * 0.5, "name": [f"n{i}" for i in ids]})
        path = str(root / f"part-{files - k}.parquet")
        pq.write_table(table, path, row_group_size=rows)
        paths.append(path)
    return paths


@pytest.fixture(scope="session")
def spark():
    """The suite's one local[2] SparkSession (keras_dl's own: loopback, no UI, Arrow on)."""
    from keras_dl.inference_io import spark_session

    session = spark_session("local[2]", "keras_dl-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 (and DynamoDB) API server on loopback, for the whole session."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("moto's server exited at start")
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("moto's server did not start within 60 s")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=20)


class S3Bucket:
    """A fresh bucket on the test server; ``uri(path)`` names an object under it."""

    def __init__(self, endpoint: str, name: str):
        self.endpoint, self.name = endpoint, name

    def uri(self, path: str = "") -> str:
        return f"s3://{self.name}/{path}".rstrip("/")


@pytest.fixture
def s3(s3_server, monkeypatch) -> S3Bucket:
    """The standard AWS environment pointed at the test server, and a new empty bucket."""
    import uuid

    import boto3

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_server,
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_S3_LOCKING_PROVIDER", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    name = f"lake-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return S3Bucket(s3_server, name)
