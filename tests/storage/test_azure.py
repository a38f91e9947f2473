"""Tables and files on Azure Blob storage (``abfss://``), through Azurite's real Blob API on
loopback: read, train, ingest with conditional commits, every way to give the credentials, and
errors that name what is missing. Azurite has no ADLS Gen2 (dfs) endpoint: flat namespace only."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from keras_dl.config import DataConfig
from keras_dl.data import make_splits, open_table, read_table
from keras_dl.data.ingest.datasets import ingest_sklearn_digits, write_table
from keras_dl.errors import DataError
from keras_dl.storage import open_storage, open_store
from tests.azurite import ACCOUNT, point_azure_at


def test_a_digits_table_on_azure_reads_and_trains_like_a_local_one(azure, tmp_path):
    table = azure.uri("digits")
    report = ingest_sklearn_digits(table, rows_per_group=256)
    assert report.rows == 1797 and report.row_groups >= 7
    assert read_table(table).num_rows == 1797
    files = open_table(table).files
    assert files[0].startswith(f"abfss://{azure.name}@{ACCOUNT}.dfs.core.windows.net/digits/")
    data = make_splits(
        DataConfig(table=table, split_column="split", label="label", features=("pixels",)),
        batch_size=32,
        rank=1,
        world_size=2,
    )
    batch, label, weight = next(iter(data.train.dataset))
    assert batch.shape == (32, 64) and label.shape == (32,) and weight.shape == (32,)
    assert sum(int(y.shape[0]) for _, y in data.test.dataset) == data.test.stats.rows
    cached = make_splits(  # data.cache_dir: the same rows, from a local copy of the blobs
        DataConfig(table=table, split_column="split", features=("pixels",),
                   cache_dir=str(tmp_path / "cache")),
        batch_size=32,
    )  # fmt: skip
    assert cached.train.snapshot.local_copies.wait(timeout=60)  # copied in the background
    assert all("://" not in f for f in cached.train.snapshot.with_local_copies().files)
    assert cached.test.stats.rows == data.test.stats.rows


def test_azure_commits_race_safely_without_a_lock(azure):
    from deltalake import DeltaTable, write_deltalake

    from keras_dl.storage import delta_storage_options

    uri = azure.uri("b")
    assert (write_table(pa.table({"x": np.arange(4)}), uri).version, 0) == (0, 0)
    # Two writers that both loaded version 0 commit: the second one's conditional PUT of
    # version 1 fails (If-None-Match) and it commits version 2; nothing is lost.
    options = delta_storage_options(uri)
    first, second = (DeltaTable(uri, storage_options=options) for _ in range(2))
    write_deltalake(first, pa.table({"x": np.arange(4, 6)}), mode="append")
    write_deltalake(second, pa.table({"x": np.arange(6, 9)}), mode="append")
    assert open_table(uri).version == 2
    assert sorted(read_table(uri).column("x").to_pylist()) == list(range(9))


@pytest.mark.parametrize("how", ["key", "connection_string", "sas", "short_uri"])
def test_every_standard_way_to_name_the_account_reaches_it(azure, monkeypatch, how):
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    from tests.azurite import KEY

    azure.client().upload_blob("t/a.txt", b"hello")
    azure.client().upload_blob("t/sub/b.txt", b"world")
    uri = azure.uri("t")
    if how == "connection_string":
        point_azure_at(azure.server, monkeypatch, how="connection_string")
    elif how == "sas":
        token = generate_account_sas(
            ACCOUNT, KEY, ResourceTypes(service=True, container=True, object=True),
            AccountSasPermissions(read=True, write=True, list=True, delete=True, create=True),
            expiry=datetime.now(timezone.utc) + timedelta(hours=1),
        )  # fmt: skip
        monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
        monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?" + token)
    elif how == "short_uri":  # abfs://container/path, the account from the environment
        uri = f"abfs://{azure.name}/t"
    storage = open_storage(uri)
    assert storage.list() == [("a.txt", storage.list()[0][1])]
    assert storage.is_dir("sub") and storage.read_text("a.txt") == "hello"
    assert storage.read_bytes(storage.path("sub/b.txt"), 1, 3) == b"orl"
    assert storage.strip(storage.file_uri(storage.path("a.txt"))) == storage.path("a.txt")
    assert storage.file_uri(storage.path("a.txt")) == f"{uri}/a.txt"
    store = open_store(uri)
    store.write("c.txt", b"!")
    assert store.list() == {"a.txt": 5, "c.txt": 1}
    write_table(pa.table({"x": np.arange(3)}), f"{uri}/delta")
    assert read_table(f"{uri}/delta").column("x").to_pylist() == [0, 1, 2]


def test_a_missing_container_account_or_endpoint_is_named(azure, monkeypatch):
    with pytest.raises(DataError, match=r"Container 'no-such' .* does not exist in the storage"):
        read_table(f"abfss://no-such@{ACCOUNT}.dfs.core.windows.net/t")
    with pytest.raises(DataError, match=r"'abfss://.*/nothing' does not exist"):
        read_table(azure.uri("nothing"))
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    with pytest.raises(DataError, match=r"names no storage account.*AZURE_STORAGE_ACCOUNT_NAME"):
        read_table(f"abfss://{azure.name}/t")
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", f"http://127.0.0.1:9/{ACCOUNT}")
    with pytest.raises(DataError, match=r"cannot be reached .*127.0.0.1:9.*AZURE_STORAGE_ENDPOINT"):
        read_table(azure.uri("t"))
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", azure.server.endpoint)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "AAAA" + "A" * 84)
    with pytest.raises(DataError, match=r"(?s)cannot be reached .*account key \(AZURE_STORAGE_ACC"):
        read_table(azure.uri("t"))


@pytest.mark.slow
def test_digits_trains_with_its_table_run_dir_and_mlflow_artifacts_on_azure(
    azure, monkeypatch, tmp_path
):
    import json

    import mlflow

    from tests.conftest import train_digits

    # One connection string for keras_dl and MLflow's wasbs:// store (which reads only
    # AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCESS_KEY with Azure's public endpoint).
    point_azure_at(azure.server, monkeypatch, how="connection_string")
    table = azure.uri("digits")
    ingest_sklearn_digits(table, rows_per_group=256)
    artifacts = f"wasbs://{azure.name}@{ACCOUNT}.blob.core.windows.net/mlflow"
    _, result, uri = train_digits(
        table,
        tmp_path,
        "train.epochs=1",
        f"runtime.run_dir={azure.uri('runs/digits')}",
        "runtime.lease_seconds=15",
        f"tracking.artifact_location={artifacts}",
        "callbacks.plots=false",
    )
    assert result.registered_version == 1
    run_files = [n.removeprefix("runs/digits/") for n in azure.names() if n.startswith("runs/")]
    assert run_files == [
        "checkpoints/COMPLETE",
        "checkpoints/ckpt-000000040.json",
        "checkpoints/ckpt-000000040.npz",
        "config.yaml",
        "run.json",
    ]  # and no .lease.json: released at the end
    run_json = azure.client().download_blob("runs/digits/run.json").readall()
    assert json.loads(run_json)["run_id"] == result.run_id
    # The model lives in the container, not beside the SQLite store, and loads back from there.
    run = mlflow.MlflowClient(uri).get_run(result.run_id)
    assert run.info.artifact_uri.startswith(f"{artifacts}/")
    assert any(n.startswith("mlflow/") and n.endswith("MLmodel") for n in azure.names())
    assert not (tmp_path / "mlartifacts").exists()
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/digits/{result.registered_version}")
    pixels = np.asarray(read_table(table).column("pixels").to_pylist()[:4], dtype="float64")
    np.testing.assert_allclose(
        np.asarray(model.predict(pixels)), result.model.predict(pixels, verbose=0), atol=1e-5
    )
