"""Checkpoints in an object-store run directory (moto's real S3 server and Azurite's real Blob
API on loopback): uploaded, counted by a manifest written last, resumed from the newest valid
one, pruned without losing it."""

from __future__ import annotations

import json

import boto3
import numpy as np
import pytest

from keras_dl.callbacks import Checkpoint
from keras_dl.callbacks.checkpoint import is_complete, list_checkpoints, read_header
from keras_dl.checkpoints import Checkpoints
from tests.callbacks.helpers import tiny_data, tiny_model


class _S3:
    def __init__(self, bucket):
        self.bucket, self.uri = bucket, bucket.uri

    def names(self, prefix: str) -> list[str]:
        listed = boto3.client("s3").list_objects_v2(Bucket=self.bucket.name, Prefix=prefix + "/")
        return [o["Key"] for o in listed.get("Contents", [])]

    def get(self, key: str) -> bytes:
        return boto3.client("s3").get_object(Bucket=self.bucket.name, Key=key)["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        boto3.client("s3").put_object(Bucket=self.bucket.name, Key=key, Body=data)

    def delete(self, key: str) -> None:
        boto3.client("s3").delete_object(Bucket=self.bucket.name, Key=key)


class _Azure:
    def __init__(self, container):
        self.container, self.uri = container, container.uri

    def names(self, prefix: str) -> list[str]:
        return [b.name for b in self.container.client().list_blobs(name_starts_with=prefix + "/")]

    def get(self, key: str) -> bytes:
        return self.container.client().download_blob(key).readall()

    def put(self, key: str, data: bytes) -> None:
        self.container.client().upload_blob(key, data, overwrite=True)

    def delete(self, key: str) -> None:
        self.container.client().delete_blob(key)


@pytest.fixture(params=["s3", pytest.param("azure", marks=pytest.mark.slow)])  # Azurite: 35-46 s
def s3(request):
    """The store under test (named ``s3`` as these tests were first written for it)."""
    wrap = _S3 if request.param == "s3" else _Azure
    return wrap(request.getfixturevalue(request.param))


def _names(s3, prefix: str) -> list[str]:
    # pyarrow leaves an empty "folder/" marker object when it deletes a folder's last file.
    names = (k[len(prefix) + 1 :] for k in s3.names(prefix))
    return sorted(n for n in names if n and not n.endswith("/"))


def test_fit_writes_manifested_checkpoints_to_s3_and_resumes_the_newest(s3):
    x, y = tiny_data(64)
    directory = s3.uri("run/checkpoints")
    model = tiny_model()
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[Checkpoint(directory, keep=2)])
    assert _names(s3, "run/checkpoints") == [
        "COMPLETE",
        "ckpt-000000008.json",
        "ckpt-000000008.npz",
        "ckpt-000000012.json",
        "ckpt-000000012.npz",
    ]
    manifest = json.loads(s3.get("run/checkpoints/ckpt-000000012.json"))
    size = manifest["files"]["ckpt-000000012.npz"]["size"]
    assert size > 0 and len(manifest["files"]["ckpt-000000012.npz"]["sha256"]) == 64
    assert is_complete(directory)
    assert [u.rsplit("/", 1)[1] for u in list_checkpoints(directory)] == [
        "ckpt-000000008.npz",
        "ckpt-000000012.npz",
    ]
    assert read_header(list_checkpoints(directory)[-1])["global_step"] == 12

    # Resume (without COMPLETE): a fresh model gets the newest checkpoint's weights.
    s3.delete("run/checkpoints/COMPLETE")
    fresh = tiny_model(seed=1)
    ckpt = Checkpoint(directory, keep=2)
    ckpt.set_model(fresh)
    assert ckpt.restore() == 12
    for a, b in zip(model.variables, fresh.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_only_files_matching_a_manifest_count_and_pruning_keeps_the_newest_valid(s3):
    x, y = tiny_data(64)
    directory = s3.uri("c")
    model = tiny_model()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[Checkpoint(directory, keep=3)])
    data = s3.get("c/ckpt-000000008.npz")
    # An upload killed before its manifest (newer and older than the newest valid), and a file
    # that no longer matches its manifest.
    s3.put("c/ckpt-000000020.npz", data)
    s3.put("c/ckpt-000000006.npz", data)
    s3.put("c/ckpt-000000004.npz", data[: len(data) // 2])
    assert [u.rsplit("/", 1)[1] for u in list_checkpoints(directory)] == ["ckpt-000000008.npz"]
    # Same size, other bytes: listed (sizes match) but refused on load (SHA-256).
    s3.put("c/ckpt-000000008.npz", data[::-1])
    with pytest.raises(ValueError, match="does not match its manifest"):
        read_header(s3.uri("c/ckpt-000000008.npz"))
    s3.put("c/ckpt-000000008.npz", data)

    Checkpoints(directory, keep=1).prune()
    assert _names(s3, "c") == [
        "COMPLETE",
        "ckpt-000000008.json",
        "ckpt-000000008.npz",
        "ckpt-000000020.npz",  # newer than the newest valid: not removed
    ]
    # With no valid checkpoint at all, nothing is pruned.
    Checkpoints(s3.uri("empty"), keep=1).prune()
    s3.put("p/ckpt-000000002.npz", data)
    Checkpoints(s3.uri("p"), keep=1).prune()
    assert _names(s3, "p") == ["ckpt-000000002.npz"]


def test_another_configs_checkpoints_are_set_aside_and_resume_false_clears(s3):
    x, y = tiny_data(32)
    directory = s3.uri("r/checkpoints")
    tiny_model().fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[Checkpoint(directory, metadata={"config": "a"}, mark_complete=False)],
    )
    other = Checkpoint(directory, metadata={"config": "b"})
    other.set_model(tiny_model())
    assert other.restore() == 0
    assert _names(s3, "r/checkpoints") == [
        "previous/ckpt-000000002.json",
        "previous/ckpt-000000002.npz",
        "previous/ckpt-000000004.json",
        "previous/ckpt-000000004.npz",
    ]
    tiny_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[other])
    assert "ckpt-000000002.json" in _names(s3, "r/checkpoints")
    fresh = Checkpoint(directory, resume=False)
    fresh.set_model(tiny_model())
    assert fresh.restore() == 0
    assert [n for n in _names(s3, "r/checkpoints") if not n.startswith("previous/")] == []
