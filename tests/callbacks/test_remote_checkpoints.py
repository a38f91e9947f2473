"""Checkpoints in an S3 run directory (moto's real S3 server on loopback): uploaded, counted by
a manifest written last, resumed from the newest valid one, pruned without losing it."""

from __future__ import annotations

import json

import boto3
import numpy as np
import pytest

from keras_dl.callbacks import Checkpoint
from keras_dl.callbacks.checkpoint import is_complete, list_checkpoints, read_header
from keras_dl.checkpoints import Checkpoints
from tests.callbacks.helpers import tiny_data, tiny_model


def _names(s3, prefix: str) -> list[str]:
    listed = boto3.client("s3").list_objects_v2(Bucket=s3.name, Prefix=prefix + "/")
    # pyarrow leaves an empty "folder/" marker object when it deletes a folder's last file.
    names = (o["Key"][len(prefix) + 1 :] for o in listed.get("Contents", []))
    return sorted(n for n in names if n)


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
    manifest = json.loads(
        boto3.client("s3")
        .get_object(Bucket=s3.name, Key="run/checkpoints/ckpt-000000012.json")["Body"]
        .read()
    )
    size = manifest["files"]["ckpt-000000012.npz"]["size"]
    assert size > 0 and len(manifest["files"]["ckpt-000000012.npz"]["sha256"]) == 64
    assert is_complete(directory)
    assert [u.rsplit("/", 1)[1] for u in list_checkpoints(directory)] == [
        "ckpt-000000008.npz",
        "ckpt-000000012.npz",
    ]
    assert read_header(list_checkpoints(directory)[-1])["global_step"] == 12

    # Resume (without COMPLETE): a fresh model gets the newest checkpoint's weights.
    boto3.client("s3").delete_object(Bucket=s3.name, Key="run/checkpoints/COMPLETE")
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
    client = boto3.client("s3")
    data = client.get_object(Bucket=s3.name, Key="c/ckpt-000000008.npz")["Body"].read()
    # An upload killed before its manifest (newer and older than the newest valid), and a file
    # that no longer matches its manifest.
    client.put_object(Bucket=s3.name, Key="c/ckpt-000000020.npz", Body=data)
    client.put_object(Bucket=s3.name, Key="c/ckpt-000000006.npz", Body=data)
    client.put_object(Bucket=s3.name, Key="c/ckpt-000000004.npz", Body=data[: len(data) // 2])
    assert [u.rsplit("/", 1)[1] for u in list_checkpoints(directory)] == ["ckpt-000000008.npz"]
    # Same size, other bytes: listed (sizes match) but refused on load (SHA-256).
    client.put_object(Bucket=s3.name, Key="c/ckpt-000000008.npz", Body=data[::-1])
    with pytest.raises(ValueError, match="does not match its manifest"):
        read_header(s3.uri("c/ckpt-000000008.npz"))
    client.put_object(Bucket=s3.name, Key="c/ckpt-000000008.npz", Body=data)

    Checkpoints(directory, keep=1).prune()
    assert _names(s3, "c") == [
        "COMPLETE",
        "ckpt-000000008.json",
        "ckpt-000000008.npz",
        "ckpt-000000020.npz",  # newer than the newest valid: not removed
    ]
    # With no valid checkpoint at all, nothing is pruned.
    Checkpoints(s3.uri("empty"), keep=1).prune()
    client.put_object(Bucket=s3.name, Key="p/ckpt-000000002.npz", Body=data)
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
