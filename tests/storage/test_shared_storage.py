"""Tables on object storage, through a real S3 API (moto's server on loopback): read, train,
ingest with conditional commits, cache locally, and clear errors for a missing bucket."""

from __future__ import annotations

import boto3
import numpy as np
import pyarrow as pa
import pytest

from keras_dl.config import DataConfig
from keras_dl.data import make_splits, open_table, read_table
from keras_dl.data.ingest.datasets import ingest_sklearn_digits, write_table
from keras_dl.errors import DataError


def test_a_digits_table_on_s3_reads_and_trains_like_a_local_one(s3, monkeypatch, tmp_path):
    table = s3.uri("digits")
    report = ingest_sklearn_digits(table, rows_per_group=128)
    assert report.rows == 1797 and report.row_groups >= 10
    assert read_table(table).num_rows == 1797
    assert open_table(table).files[0].startswith(f"s3://{s3.name}/digits/")
    data = make_splits(
        DataConfig(table=table, split_column="split", label="label", features=("pixels",)),
        batch_size=32,
        rank=1,
        world_size=2,
    )
    # Two ranks: batches carry a sample weight (0 for the padding that evens out the shards).
    batch, label, weight = next(iter(data.train.dataset))
    assert batch.shape == (32, 64) and label.shape == (32,) and weight.shape == (32,)
    test_rows = sum(int(y.shape[0]) for _, y in data.test.dataset)  # not sharded: whole
    assert test_rows == data.test.stats.rows
    # data.cache_dir: the same rows, read from a local copy of the S3 files.
    cached = make_splits(
        DataConfig(table=table, split_column="split", features=("pixels",),
                   cache_dir=str(tmp_path / "cache")),
        batch_size=32,
    )  # fmt: skip
    assert cached.train.snapshot.local_copies.wait(timeout=60)  # copied in the background
    assert all(not f.startswith("s3://") for f in cached.train.snapshot.with_local_copies().files)
    assert cached.test.stats.rows == data.test.stats.rows


def test_s3_commits_race_safely_without_a_lock_and_a_dynamodb_lock_is_refused(s3, monkeypatch):
    from deltalake import DeltaTable, write_deltalake

    from keras_dl.storage import delta_storage_options

    report = write_table(pa.table({"x": np.arange(4)}), s3.uri("b"))
    assert (report.version, report.rows) == (0, 4)
    # Two writers that both loaded version 0 commit: the second one's PUT of version 1 fails
    # (If-None-Match) and it commits version 2; nothing is lost.
    options = delta_storage_options(s3.uri("b"))
    first, second = (DeltaTable(s3.uri("b"), storage_options=options) for _ in range(2))
    write_deltalake(first, pa.table({"x": np.arange(4, 6)}), mode="append")
    write_deltalake(second, pa.table({"x": np.arange(6, 9)}), mode="append")
    assert open_table(s3.uri("b")).version == 2
    assert sorted(read_table(s3.uri("b")).column("x").to_pylist()) == list(range(9))
    monkeypatch.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")
    monkeypatch.setenv("DELTA_DYNAMO_TABLE_NAME", "locks")
    with pytest.raises(DataError, match=r"dropped the DynamoDB lock.*unset AWS_S3_LOCKING_PROV"):
        write_table(pa.table({"x": np.arange(4)}), s3.uri("a"))
    assert not any(k for k, _ in _list(s3, "a"))  # refused before writing anything


def test_a_missing_bucket_or_table_is_named(s3, monkeypatch):
    with pytest.raises(DataError, match=r"Bucket 'no-such-bucket' .* does not exist at http"):
        read_table("s3://no-such-bucket/t")
    with pytest.raises(DataError, match=r"'s3://.*/nothing' does not exist"):
        read_table(s3.uri("nothing"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(
        DataError, match=r"cannot be reached at http://127.0.0.1:9.*AWS_ENDPOINT_URL"
    ):
        read_table(s3.uri("t"))


def _list(s3, prefix):
    listing = boto3.client("s3").list_objects_v2(Bucket=s3.name, Prefix=prefix)
    return [(o["Key"], o["Size"]) for o in listing.get("Contents", [])]


def test_mlflow_s3_endpoint_follows_aws_endpoint_url_unless_set(s3, monkeypatch):
    from keras_dl.storage import environment

    monkeypatch.delenv("MLFLOW_S3_ENDPOINT_URL", raising=False)
    assert environment()["MLFLOW_S3_ENDPOINT_URL"] == s3.endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")  # the S3-specific one wins
    assert environment()["MLFLOW_S3_ENDPOINT_URL"] == "http://127.0.0.1:1"
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", "http://mlflow-only:9000")  # set: kept
    assert environment()["MLFLOW_S3_ENDPOINT_URL"] == "http://mlflow-only:9000"


def _keys(bucket: str, prefix: str) -> list[str]:
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    # pyarrow leaves an empty "folder/" marker object when it deletes a folder's last file.
    return sorted(o["Key"] for o in listed.get("Contents", []) if not o["Key"].endswith("/"))


@pytest.mark.slow
def test_digits_trains_with_its_table_run_dir_and_model_on_s3(s3, monkeypatch, tmp_path):
    import json

    import mlflow

    from keras_dl.errors import ConfigError
    from keras_dl.tracking import setup_mlflow
    from tests.conftest import train_digits

    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", "")  # so that the teardown restores it
    monkeypatch.delenv("MLFLOW_S3_ENDPOINT_URL")  # mapped from AWS_ENDPOINT_URL
    table = s3.uri("digits")
    ingest_sklearn_digits(table, rows_per_group=256)
    _, result, uri = train_digits(
        table,
        tmp_path,
        "train.epochs=1",
        f"runtime.run_dir={s3.uri('runs/digits')}",
        f"tracking.artifact_location={s3.uri('mlflow')}",
        "callbacks.plots=false",
    )
    assert result.registered_version == 1
    run_files = [k.removeprefix("runs/digits/") for k in _keys(s3.name, "runs/digits/")]
    assert run_files == [
        "checkpoints/COMPLETE",
        "checkpoints/ckpt-000000040.json",
        "checkpoints/ckpt-000000040.npz",
        "config.yaml",
        "run.json",
    ]  # and no .lease.json: released at the end
    run_json = boto3.client("s3").get_object(Bucket=s3.name, Key="runs/digits/run.json")
    assert json.loads(run_json["Body"].read())["run_id"] == result.run_id
    # The model lives in the bucket, not beside the SQLite store, and loads back from there.
    run = mlflow.MlflowClient(uri).get_run(result.run_id)
    assert run.info.artifact_uri.startswith(f"s3://{s3.name}/mlflow/")
    assert any(k.endswith("MLmodel") for k in _keys(s3.name, "mlflow/"))
    assert not (tmp_path / "mlartifacts").exists()
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/digits/{result.registered_version}")
    pixels = read_table(table).column("pixels").to_pylist()[:4]
    scores = np.asarray(model.predict(np.asarray(pixels, dtype="float64")))
    assert scores.shape == (4, 10)
    np.testing.assert_allclose(
        scores, result.model.predict(np.asarray(pixels), verbose=0), atol=1e-5
    )
    # The experiment's artifact location cannot change under it.
    with pytest.raises(ConfigError, match=rf"s3://{s3.name}/mlflow.*s3://elsewhere/mlflow"):
        setup_mlflow(uri, "digits", "s3://elsewhere/mlflow")
