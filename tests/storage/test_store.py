"""One Store interface over a local folder, an S3 prefix (moto's real server on loopback) and an
Azure prefix (Azurite's real Blob API on loopback):
the same calls give the same files, writes are whole, and a missing file is named the same way."""

from __future__ import annotations

import hashlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.storage import LocalStore, ObjectStore, open_store, store_of


@pytest.fixture(params=["local", "s3", pytest.param("azure", marks=pytest.mark.slow)])  # 23 s
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "run")
    if request.param == "azure":  # Azurite: a flat namespace, where a move is copy + delete
        return open_store(request.getfixturevalue("azure").uri(f"run-{os.urandom(4).hex()}"))
    s3 = request.getfixturevalue("s3")
    return open_store(s3.uri(f"run-{os.urandom(4).hex()}"))


def test_open_store_picks_the_implementation_from_the_uri(tmp_path):
    assert isinstance(open_store(tmp_path), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert open_store(f"file://{tmp_path}") == open_store(str(tmp_path))
    assert isinstance(open_store("s3://bucket/prefix/"), ObjectStore)
    assert open_store("s3://bucket/prefix/").uri == "s3://bucket/prefix"


def test_write_read_list_exists_and_remove_behave_the_same(store):
    assert store.list() == {}
    assert not store.exists("run.json")
    with pytest.raises(FileNotFoundError):
        store.read("run.json")
    assert store.read_json("run.json", default={}) == {}
    store.write_json("run.json", {"run_id": "abc"})
    store.write_text("config.yaml", "a: 1\n")
    assert store.read_json("run.json") == {"run_id": "abc"}
    assert store.read_text("config.yaml") == "a: 1\n"
    assert store.exists("run.json")
    assert store.list() == {"run.json": 17, "config.yaml": 5}
    store.write("run.json", b"{}")  # overwrite in place
    assert store.read("run.json") == b"{}"
    store.remove("run.json")
    store.remove("run.json")  # removing a missing file is not an error
    assert list(store.list()) == ["config.yaml"]


def test_children_are_folders_of_the_same_kind(store):
    child = store.child("checkpoints")
    assert type(child) is type(store)
    child.write("COMPLETE", b"7")
    assert store.list() == {}  # only the files directly in a folder are listed
    assert child.list() == {"COMPLETE": 1}
    assert child.path("COMPLETE").startswith(store.uri)


def test_upload_copies_a_local_file_whole_and_reports_its_size_and_digest(store, tmp_path):
    data = os.urandom(3 << 20)
    local = tmp_path / "ckpt.npz"
    local.write_bytes(data)
    size, digest = store.upload(local, "ckpt-000000001.npz")
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert store.read("ckpt-000000001.npz") == data
    assert list(store.list()) == ["ckpt-000000001.npz"]  # no temporary file is left behind


def test_a_local_write_leaves_no_temporary_file(tmp_path):
    store = open_store(tmp_path / "run")
    for i in range(3):
        store.write("run.json", str(i).encode())
    assert os.listdir(tmp_path / "run") == ["run.json"]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_.-]{0,11}", fullmatch=True), st.binary(max_size=64), max_size=6
    )
)
def test_a_local_folder_lists_exactly_what_was_written(tmp_path, files):
    store = open_store(tmp_path / os.urandom(4).hex())
    for name, data in files.items():
        store.write(name, data)
    assert store.list() == {name: len(data) for name, data in files.items()}
    assert all(store.read(name) == data for name, data in files.items())


def test_download_copies_a_file_out_with_its_size_and_digest(store, tmp_path):
    data = os.urandom(1 << 20)
    store.write("ckpt-000000002.npz", data)
    out = tmp_path / "out.npz"
    assert store.download("ckpt-000000002.npz", out) == (
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
    assert out.read_bytes() == data
    with pytest.raises(FileNotFoundError):
        store.download("missing.npz", tmp_path / "missing.npz")


def test_move_puts_a_file_into_another_folder_of_the_same_store(store, tmp_path):
    store.write("ckpt-000000003.json", b"{}")
    aside = store.child("previous")
    aside.write("ckpt-000000003.json", b"old")
    store.move("ckpt-000000003.json", aside)
    assert "ckpt-000000003.json" not in store.list()
    assert aside.read("ckpt-000000003.json") == b"{}"  # replaced what was there
    local = isinstance(store, LocalStore)
    other = ObjectStore("s3://bucket/x") if local else open_store(tmp_path / "x")
    with pytest.raises(ValueError, match="not on the same store"):
        aside.move("ckpt-000000003.json", other)


def test_store_of_splits_a_file_uri_into_its_folder_and_name(tmp_path):
    store, name = store_of(tmp_path / "run" / "model.keras")
    assert (store, name) == (open_store(tmp_path / "run"), "model.keras")
    store, name = store_of("s3://bucket/runs/abc/model.keras")
    assert (store, name) == (open_store("s3://bucket/runs/abc"), "model.keras")
    with pytest.raises(ValueError, match="names no file"):
        store_of("")


def test_temporaries_of_a_killed_local_writer_are_removed_and_nothing_else(tmp_path):
    store = open_store(tmp_path / "run")
    store.write("run.json", b"{}")
    store.write("a.1.json", b"{}")  # a name with digits, not a temporary
    (tmp_path / "run" / "ckpt-000000004.npz.4242.tmp").write_bytes(b"partial")
    (tmp_path / "run" / "run.json.77.tmp").write_bytes(b"{")
    assert sorted(store.remove_temporaries()) == ["ckpt-000000004.npz.4242.tmp", "run.json.77.tmp"]
    assert sorted(store.list()) == ["a.1.json", "run.json"]


def test_an_object_store_has_no_temporaries(s3):
    store = open_store(s3.uri("run"))
    store.write("run.json.77.tmp", b"a user's file")  # written whole: not ours to delete
    assert store.remove_temporaries() == []
    assert list(store.list()) == ["run.json.77.tmp"]
