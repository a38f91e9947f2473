"""One pyarrow filesystem per store and settings, shared by every call (keras_dl.storage).

Building one per call cost a reader on a busy process tens of milliseconds each: 13 of them
were 0.44 of the 0.54 s the first read of an epoch took to open at 40 ms (``keras-dl bench
input --store s3``). The settings are the cache's key, so changed credentials or endpoints get
a filesystem of their own.
"""

from __future__ import annotations

from keras_dl.storage import filesystem
from keras_dl.storage.azure import EMULATOR_KEY


def test_one_s3_filesystem_per_settings(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "one")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    fs, path = filesystem("s3://bucket/table/part-0.parquet")
    again, other = filesystem("s3a://bucket/table/part-1.parquet")
    assert (path, other) == ("bucket/table/part-0.parquet", "bucket/table/part-1.parquet")
    assert again is fs
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "two")  # rotated credentials: a new client
    rotated, _ = filesystem("s3://bucket/table/part-0.parquet")
    assert rotated is not fs
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")
    moved, _ = filesystem("s3://bucket/table/part-0.parquet")
    assert moved is not rotated
    assert moved.region == "us-east-1"


def test_one_azure_filesystem_per_account_and_identity(monkeypatch):
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", EMULATOR_KEY)
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:9/devstoreaccount1")
    uri = "abfss://data@devstoreaccount1.dfs.core.windows.net/table/part-0.parquet"
    fs, path = filesystem(uri)
    again, _ = filesystem(uri.replace("part-0", "part-1"))
    assert path == "data/table/part-0.parquet"
    assert again is fs
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:10/devstoreaccount1")
    assert filesystem(uri)[0] is not fs
