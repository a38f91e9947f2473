"""The checkpoint protocol on a local folder and on an S3 prefix (moto's real server on
loopback): a checkpoint counts once its manifest, written last, matches it; pruning never loses
the newest one; checkpoints written before manifests (a local .npz made whole by a rename) still
count when they read back, and get their manifests."""

from __future__ import annotations

import io
import json
import logging
import os

import numpy as np
import pytest

from keras_dl.callbacks import Checkpoint
from keras_dl.checkpoints import COMPLETE, FINISHING, Checkpoints
from tests.callbacks.helpers import tiny_data, tiny_model


@pytest.fixture(params=["local", "s3"])
def ckpts(request, tmp_path):
    if request.param == "local":
        return Checkpoints(tmp_path / "checkpoints", keep=2)
    s3 = request.getfixturevalue("s3")
    return Checkpoints(s3.uri(f"run-{os.urandom(4).hex()}/checkpoints"), keep=2)


def trained(seed: int = 0):
    """A tiny model after one epoch: its optimizer is built, its weights moved."""
    model = tiny_model(seed)
    model.fit(*tiny_data(), batch_size=32, epochs=1, verbose=0)
    return model


def _weights(model):
    return [np.asarray(v) for v in [*model.variables, *model.optimizer.variables]]


def legacy(data: bytes) -> bytes:
    """A checkpoint's bytes as keras_dl wrote them before manifests: no ``format`` header."""
    with np.load(io.BytesIO(data)) as npz:
        arrays = {k: npz[k] for k in npz.files}
    header = json.loads(arrays["header"].tobytes())
    del header["format"]
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def test_a_saved_checkpoint_counts_by_its_manifest_and_loads_verified(ckpts):
    model = trained()
    assert ckpts.list() == [] and ckpts.newest_header() is None
    assert ckpts.save(4, model, {"epoch": 1}) == "ckpt-000000004.npz"
    files = ckpts.store.list()
    assert sorted(files) == ["ckpt-000000004.json", "ckpt-000000004.npz"]
    manifest = ckpts.store.read_json("ckpt-000000004.json")["files"]["ckpt-000000004.npz"]
    assert manifest["size"] == files["ckpt-000000004.npz"] and len(manifest["sha256"]) == 64
    assert ckpts.list() == ["ckpt-000000004.npz"]
    assert ckpts.read_header("ckpt-000000004.npz")["epoch"] == 1
    assert ckpts.newest_header()["format"] == 2
    other = tiny_model(seed=1)
    assert ckpts.load("ckpt-000000004.npz", other)["epoch"] == 1
    for got, want in zip(_weights(other), _weights(model)):
        np.testing.assert_array_equal(got, want)


def test_files_without_a_matching_manifest_do_not_count(ckpts):
    model = trained()
    ckpts.save(4, model, {"epoch": 1})
    data = ckpts.store.read("ckpt-000000004.npz")
    # An upload whose manifest was never written (whole, but written by this version), and
    # one a plain non-atomic write cut in half.
    ckpts.store.write("ckpt-000000006.npz", data)
    ckpts.store.write("ckpt-000000008.npz", data[: len(data) // 2])
    assert ckpts.list() == ["ckpt-000000004.npz"]
    why = ckpts.uncounted()
    assert sorted(why) == ["ckpt-000000006.npz", "ckpt-000000008.npz"]
    assert "no manifest" in why["ckpt-000000006.npz"]
    assert "does not read back" in why["ckpt-000000008.npz"]
    with pytest.raises(ValueError, match="has no manifest"):
        ckpts.read_header("ckpt-000000006.npz")
    # A manifest that does not match: another size does not count; the same size with other
    # bytes is listed (sizes are what a listing can check) but refused on load (SHA-256).
    ckpts.store.write("ckpt-000000004.npz", data + b"x")
    assert ckpts.list() == [] and "manifest says" in ckpts.uncounted()["ckpt-000000004.npz"]
    ckpts.store.write("ckpt-000000004.npz", data[::-1])
    assert ckpts.list() == ["ckpt-000000004.npz"]
    with pytest.raises(ValueError, match="does not match its manifest"):
        ckpts.load("ckpt-000000004.npz", tiny_model())
    with pytest.raises(ValueError, match="does not match its manifest"):
        ckpts.read_header("ckpt-000000004.npz")


def test_pruning_keeps_the_newest_counted_and_newer_partial_files(ckpts):
    model = trained()
    data = None
    for step in (2, 4, 6):
        ckpts.save(step, model, {})
        data = data or ckpts.store.read("ckpt-000000002.npz")
    assert ckpts.list() == ["ckpt-000000004.npz", "ckpt-000000006.npz"]  # keep=2
    # Without a manifest: one older than the newest counted, one newer; an orphan manifest.
    ckpts.store.write("ckpt-000000005.npz", data)
    ckpts.store.write("ckpt-000000009.npz", data)
    ckpts.store.write("ckpt-000000003.json", b"{}")
    assert ckpts.prune() == ["ckpt-000000003.json", "ckpt-000000005.npz"]
    assert sorted(ckpts.store.list()) == [
        "ckpt-000000004.json",
        "ckpt-000000004.npz",
        "ckpt-000000006.json",
        "ckpt-000000006.npz",
        "ckpt-000000009.npz",  # newer than the newest counted: it may still become one
    ]
    # With nothing counted, nothing is pruned.
    empty = Checkpoints(ckpts.store.child("other"), keep=1)
    empty.store.write("ckpt-000000002.npz", data)
    assert empty.prune() == [] and list(empty.store.list()) == ["ckpt-000000002.npz"]


def test_a_checkpoint_replaced_at_the_same_step_stops_counting_first(ckpts):
    ckpts.save(4, tiny_model(), {"epoch": 1})
    removed = []
    remove = ckpts.store.remove
    ckpts.store.remove = lambda name: (removed.append(name), remove(name))
    ckpts.save(4, tiny_model(seed=1), {"epoch": 2})
    assert removed[0] == "ckpt-000000004.json"  # before the new bytes are copied in
    assert ckpts.read_header("ckpt-000000004.npz")["epoch"] == 2


def test_complete_set_aside_and_clear(ckpts):
    model = trained()
    ckpts.save(2, model, {})
    ckpts.save(4, model, {})
    assert not ckpts.is_complete() and ckpts.completed_step() is None
    ckpts.mark_complete(4)
    assert ckpts.is_complete() and ckpts.completed_step() == 4
    ckpts.store.write_json(FINISHING, {"test_metrics": {}})
    aside = ckpts.store.child("previous")
    aside.write("ckpt-000000001.npz", b"an older set-aside checkpoint")
    assert ckpts.set_aside() == 2
    assert sorted(aside.list()) == [
        "ckpt-000000002.json",
        "ckpt-000000002.npz",
        "ckpt-000000004.json",
        "ckpt-000000004.npz",
    ]
    assert Checkpoints(aside).list() == ["ckpt-000000002.npz", "ckpt-000000004.npz"]
    assert sorted(ckpts.store.list()) == [COMPLETE]
    ckpts.save(6, model, {})
    ckpts.store.write_json(FINISHING, {})
    ckpts.clear()
    assert ckpts.store.list() == {} and len(aside.list()) == 4  # previous/ is kept


def test_checkpoints_written_before_manifests_count_when_they_read_back(ckpts):
    model = trained()
    ckpts.save(8, model, {"epoch": 2})
    old = legacy(ckpts.store.read("ckpt-000000008.npz"))
    ckpts.store.remove("ckpt-000000008.json")
    ckpts.store.write("ckpt-000000008.npz", old)
    ckpts.store.write("ckpt-000000012.npz", old[: len(old) // 2])  # not whole: never counts
    assert ckpts.list() == ["ckpt-000000008.npz"]
    assert "does not read back" in ckpts.uncounted()["ckpt-000000012.npz"]
    assert "format" not in ckpts.read_header("ckpt-000000008.npz")
    other = tiny_model(seed=1)
    ckpts.load("ckpt-000000008.npz", other)
    for got, want in zip(_weights(other), _weights(model)):
        np.testing.assert_array_equal(got, want)
    assert ckpts.adopt_legacy() == ["ckpt-000000008.npz"]
    assert ckpts.adopt_legacy() == []
    manifest = ckpts.store.read_json("ckpt-000000008.json")["files"]["ckpt-000000008.npz"]
    assert manifest["size"] == len(old)
    ckpts.store.write("ckpt-000000008.npz", old[::-1])  # now the manifest guards it
    with pytest.raises(ValueError, match="does not match its manifest"):
        ckpts.read_header("ckpt-000000008.npz")


def test_a_local_run_written_before_manifests_resumes(tmp_path, caplog, capsys):
    """What the previous version left in a run folder: .npz files renamed into place, no
    manifest, a temporary file of a writer killed mid-write. The training resumes from it."""
    model = trained()
    ckpts = Checkpoints(tmp_path, keep=3)
    for step in (4, 8):
        ckpts.save(step, model, {"epoch": step // 4, "step": 0, "global_step": step})
    for step in (4, 8):
        path = tmp_path / f"ckpt-{step:09d}.npz"
        path.write_bytes(legacy(path.read_bytes()))
        (tmp_path / f"ckpt-{step:09d}.json").unlink()
    (tmp_path / ".ckpt-000000012.npz.tmp-4242").write_bytes(b"partial")
    (tmp_path / "ckpt-000000010.npz").write_bytes(b"not a checkpoint")
    other = tiny_model(seed=1)
    ckpt = Checkpoint(tmp_path)
    ckpt.set_model(other)
    with caplog.at_level(logging.WARNING):
        assert ckpt.restore() == 8
    assert "Wrote the manifests of 2 checkpoint(s) made before manifests" in capsys.readouterr().out
    assert "Skipping unreadable checkpoint ckpt-000000010.npz" in caplog.text
    for got, want in zip(_weights(other), _weights(model)):
        np.testing.assert_array_equal(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000004.json",
        "ckpt-000000004.npz",
        "ckpt-000000008.json",
        "ckpt-000000008.npz",
        "ckpt-000000010.npz",  # newer than the newest counted: left (a later save prunes it)
    ]
