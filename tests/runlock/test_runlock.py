"""One training per run directory: the lock, its holder's name, and a dead holder's takeover."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import pytest

from keras_dl.runlock import FileLock, RunLockedError, open_run_lock
from tests.conftest import REPO, runs_in, train_digits
from tests.warm_python import REAL_PYTHON

_HOLD = """
import sys, time
from keras_dl.runlock import open_run_lock
lock = open_run_lock(sys.argv[1])
lock.acquire()
lock.update(run_id="run-of-the-first")
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process that holds ``tmp_path/run``'s lock until killed."""
    proc = subprocess.Popen(
        [REAL_PYTHON, "-c", _HOLD, str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_second_holder_is_refused_with_host_pid_and_run_id(holder, tmp_path):
    start = time.monotonic()
    with pytest.raises(RunLockedError, match=r"in use by another training") as err:
        open_run_lock(tmp_path / "run").acquire()
    assert time.monotonic() - start < 1  # at once, no waiting
    message = str(err.value)
    assert f"host {socket.gethostname()}" in message
    assert f"pid {holder.pid}" in message and "MLflow run run-of-the-first" in message
    assert "--set runtime.run_dir=" in message


def test_a_killed_holders_lock_is_taken_over(holder, tmp_path):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = open_run_lock(tmp_path / "run")
    lock.acquire()  # the kernel dropped the dead process's flock
    try:
        owner = lock.holder()
        assert owner.pid != holder.pid and owner.run_id is None  # its stale record replaced
        lock.update("mine")
        assert lock.holder().run_id == "mine"
        with pytest.raises(RunLockedError, match="MLflow run mine"):
            FileLock(tmp_path / "run").acquire()  # a second lock, even in one process
    finally:
        lock.release()
    with FileLock(tmp_path / "run"):  # released: free again
        pass


def test_training_in_a_held_run_dir_stops_before_it_creates_a_run(holder, digits_table, tmp_path):
    with pytest.raises(RunLockedError, match=rf"pid {holder.pid}.*run-of-the-first"):
        train_digits(digits_table, tmp_path, "train.epochs=1")
    assert runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}") == []
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_object_stores_without_a_lease_are_refused():
    with pytest.raises(Exception, match=r"gs://b/run is on an object store .*s3://"):
        open_run_lock("gs://b/run")


_HOLD_S3 = """
import sys, time
from keras_dl.runlock import open_run_lock
lock = open_run_lock(sys.argv[1], lease_seconds=float(sys.argv[2]))
lock.acquire()
lock.update(run_id="run-of-the-first")
print("locked", flush=True)
time.sleep(600)
"""


def _hold_s3(uri: str, seconds: float) -> subprocess.Popen:
    import os

    proc = subprocess.Popen(
        [REAL_PYTHON, "-c", _HOLD_S3, uri, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_an_s3_lease_refuses_a_second_training_naming_the_holder(s3, digits_table, tmp_path):
    import boto3

    run_dir = s3.uri("runs/digits")
    proc = _hold_s3(run_dir, 3)
    try:
        time.sleep(4)  # longer than the lease: only the holder's heartbeat keeps it
        with pytest.raises(RunLockedError, match=r"in use by another training") as err:
            open_run_lock(run_dir).acquire()
        message = str(err.value)
        assert f"pid {proc.pid}" in message and "MLflow run run-of-the-first" in message
        assert f"s3://{s3.name}/runs/digits/.lease.json" in message
        with pytest.raises(RunLockedError, match=rf"pid {proc.pid}.*run-of-the-first"):
            train_digits(digits_table, tmp_path, "train.epochs=1", f"runtime.run_dir={run_dir}")
        assert runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}") == []
        listed = boto3.client("s3").list_objects_v2(Bucket=s3.name).get("Contents", [])
        assert [o["Key"] for o in listed] == ["runs/digits/.lease.json"]  # nothing written
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_holders_s3_lease_is_taken_over_once_expired(s3):
    import boto3

    run_dir = s3.uri("run")
    # 10 s: still valid when checked below, however loaded the machine (2 s was not, on CI).
    proc = _hold_s3(run_dir, 10)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.raises(RunLockedError, match=rf"pid {proc.pid}"):  # not expired yet
        open_run_lock(run_dir).acquire()
    expires = open_run_lock(run_dir).holder().expires
    time.sleep(max(0.0, expires - time.time()) + 0.5)  # past the dead holder's expiry
    lock = open_run_lock(run_dir, lease_seconds=30)
    lock.acquire()
    try:
        assert lock.holder().pid != proc.pid and lock.holder().expires > time.time() + 20
        lock.update("mine")
        assert lock.holder().run_id == "mine"
        with pytest.raises(RunLockedError, match="MLflow run mine"):
            open_run_lock(run_dir).acquire()  # a second lease, even in one process
    finally:
        lock.release()
    listed = boto3.client("s3").list_objects_v2(Bucket=s3.name).get("Contents", [])
    assert listed == []  # released: the lease object is gone
    with open_run_lock(run_dir):  # free again
        pass


def test_an_s3_lease_in_a_missing_bucket_names_it(s3):
    from keras_dl.errors import KerasDLError

    with pytest.raises(KerasDLError, match=r"s3://no-such-bucket-x/run/.lease.json.*bucket exists"):
        open_run_lock("s3://no-such-bucket-x/run").acquire()


def test_a_lease_taken_over_from_under_its_holder_is_an_error_at_its_next_update(s3):
    import json

    import boto3

    lock = open_run_lock(s3.uri("run"), lease_seconds=30)
    lock.acquire()
    try:
        # What a run that found the lease lapsed writes (its holder could not renew in time).
        other = {"host": "elsewhere", "pid": 4242, "run_id": "theirs", "since": time.time(),
                 "expires": time.time() + 30}  # fmt: skip
        boto3.client("s3").put_object(
            Bucket=s3.name, Key="run/.lease.json", Body=json.dumps(other).encode()
        )
        with pytest.raises(
            RunLockedError, match=r"lost runtime.run_dir=.*host elsewhere, pid 4242"
        ):
            lock.update("mine")
    finally:
        lock.release()  # does not delete the other run's lease
    body = boto3.client("s3").get_object(Bucket=s3.name, Key="run/.lease.json")["Body"].read()
    assert json.loads(body)["pid"] == 4242
