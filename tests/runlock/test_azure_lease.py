"""The run lease on Azure (abfss://): a native blob lease on Azurite's real Blob API. One holder
at a time, named when refused; renewed while held; a dead holder's lease expires on the store's
clock and is taken over; released leases leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from keras_dl.errors import KerasDLError
from keras_dl.runlock import AzureLease, RunLockedError, open_run_lock
from tests.conftest import REPO
from tests.warm_python import REAL_PYTHON

_HOLD = """
import sys, time
from keras_dl.runlock import open_run_lock
lock = open_run_lock(sys.argv[1], lease_seconds=float(sys.argv[2]))
lock.acquire()
lock.update(run_id="run-of-the-first")
print("locked", flush=True)
time.sleep(600)
"""


def _hold(uri: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [REAL_PYTHON, "-c", _HOLD, uri, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _lease_state(azure, blob: str) -> str:
    return azure.client().get_blob_client(blob).get_blob_properties().lease.state


def test_an_azure_lease_is_acquired_updated_refused_to_a_second_holder_and_released(azure):
    run_dir = azure.uri("runs/digits")
    lock = open_run_lock(run_dir, lease_seconds=30)
    assert isinstance(lock, AzureLease)
    lock.acquire()
    try:
        assert _lease_state(azure, "runs/digits/.lease.json") == "leased"
        lock.update("mine")
        owner = lock.holder()
        assert owner.pid == os.getpid() and owner.run_id == "mine"
        assert owner.expires > time.time() + 25
        start = time.monotonic()
        with pytest.raises(RunLockedError, match=r"in use by another training") as err:
            open_run_lock(run_dir).acquire()  # a second lease, even in one process
        assert time.monotonic() - start < 5  # at once, no waiting
        message = str(err.value)
        assert f"pid {os.getpid()}" in message and "MLflow run mine" in message
        assert f"{run_dir}/.lease.json" in message and "blob lease" in message
    finally:
        lock.release()
    assert azure.names() == []  # released: the record (and its lease) gone
    with open_run_lock(run_dir):  # free again
        pass


@pytest.mark.slow
def test_an_azure_lease_is_renewed_while_its_holder_lives(azure):
    run_dir = azure.uri("run")
    proc = _hold(run_dir, 15)  # Azure's shortest lease
    try:
        time.sleep(17)  # longer than the lease: only the holder's renewals keep it
        with pytest.raises(RunLockedError, match=rf"pid {proc.pid}.*run-of-the-first"):
            open_run_lock(run_dir).acquire()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_dead_holders_azure_lease_is_taken_over_once_expired(azure):
    run_dir = azure.uri("run")
    proc = _hold(run_dir, 15)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    with pytest.raises(RunLockedError, match=rf"pid {proc.pid}"):  # not expired yet
        open_run_lock(run_dir).acquire()
    time.sleep(max(0.0, 15.5 - (time.monotonic() - killed)))
    lock = open_run_lock(run_dir, lease_seconds=30)
    lock.acquire()
    try:
        assert lock.holder().pid == os.getpid()  # the dead holder's record replaced
    finally:
        lock.release()
    assert azure.names() == []


def test_a_lease_taken_over_from_under_its_holder_is_an_error_at_its_next_update(azure):
    lock = open_run_lock(azure.uri("run"), lease_seconds=30)
    lock.acquire()
    blob = azure.client().get_blob_client("run/.lease.json")
    try:
        # What a run that found the lease lapsed does: it breaks in and writes its own record.
        from azure.storage.blob import BlobLeaseClient

        assert blob.get_blob_properties().lease.state == "leased"
        BlobLeaseClient(blob).break_lease(lease_break_period=0)
        theirs = blob.acquire_lease(lease_duration=60)
        other = {"host": "elsewhere", "pid": 4242, "run_id": "theirs", "since": time.time(),
                 "expires": time.time() + 60}  # fmt: skip
        blob.upload_blob(json.dumps(other).encode(), overwrite=True, lease=theirs)
        with pytest.raises(
            RunLockedError, match=r"lost runtime.run_dir=.*host elsewhere, pid 4242"
        ):
            lock.update("mine")
    finally:
        lock.release()  # does not delete the other run's record
    assert json.loads(blob.download_blob().readall())["pid"] == 4242


def test_an_azure_lease_in_a_missing_container_names_it(azure):
    uri = "abfss://no-such-container@devstoreaccount1.dfs.core.windows.net/run"
    with pytest.raises(
        KerasDLError, match=r"no-such-container.*/run/.lease.json.*ContainerNotFound"
    ):
        open_run_lock(uri).acquire()
