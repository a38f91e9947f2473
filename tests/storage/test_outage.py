"""Object-store outages: moto's real S3 server paused (SIGSTOP) and resumed (SIGCONT).

Each test starts its own moto server (the session's is shared with other tests): pausing it
must not stall them. A store that does not answer for less than the run's lease is ridden out
(retried, one line every 10 s); a longer outage ends the run KILLED with exit 75, and rerunning
the same command resumes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import mlflow
import pytest

from keras_dl.errors import StoreUnavailable
from keras_dl.runlock import S3Lease
from keras_dl.storage import open_store
from keras_dl.storage.retry import is_transient
from tests.conftest import HEAVY, HEAVY_IO, REPO, runs_in, seed_store
from tests.fixtures.s3 import MotoServer, point_aws_at


class PausableStore:
    """A moto server of this test's own, the AWS environment pointed at it, and one bucket."""

    def __init__(self, monkeypatch):
        self.server = MotoServer()
        self.bucket = point_aws_at(self.server.endpoint(), monkeypatch)
        self._timers: list[threading.Timer] = []

    def uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path}".rstrip("/")

    def pause(self) -> None:
        os.kill(self.server.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.server.proc.pid, signal.SIGCONT)

    def pause_for(self, seconds: float) -> None:
        """Pause the server now and resume it ``seconds`` later (from a timer thread)."""
        self.pause()
        timer = threading.Timer(seconds, self.resume)
        self._timers.append(timer)
        timer.start()

    def wait_resumed(self) -> None:
        for timer in self._timers:
            timer.join()

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        with contextlib.suppress(Exception):
            self.resume()
        self.server.stop()


@pytest.fixture
def store(monkeypatch):
    paused = PausableStore(monkeypatch)
    yield paused
    paused.close()


def test_timeouts_refusals_and_5xx_are_transient_and_missing_or_denied_files_are_not():
    from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

    curl = OSError(
        "When initiating multiple part upload for key 'b' in bucket 'lake': AWS Error "
        "NETWORK_CONNECTION during CreateMultipartUpload operation: curlCode: 28, Timeout was "
        "reached"
    )
    assert is_transient(curl)
    assert is_transient(ConnectionRefusedError(111, "Connection refused"))
    assert is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(ReadTimeoutError(endpoint_url="http://127.0.0.1:1"))
    busy = {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}
    assert is_transient(ClientError(busy, "PutObject"))
    denied = {"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}
    assert not is_transient(ClientError(denied, "PutObject"))
    assert not is_transient(FileNotFoundError("s3://lake/x does not exist"))
    assert not is_transient(OSError("Parquet magic bytes not found in footer"))


@pytest.mark.slow
@HEAVY_IO
def test_a_store_call_rides_out_an_outage_shorter_than_the_lease(store, caplog):
    lease = S3Lease(store.uri("run"), lease_seconds=40)
    lease.acquire()
    folder = open_store(store.uri("run"))
    try:
        store.pause_for(16)  # past the AWS SDK's own attempts (about 10 s on a paused server)
        with caplog.at_level(logging.WARNING, logger="keras_dl.storage.retry"):
            folder.write("run.json", b'{"run_id": "abc"}')
        assert folder.read("run.json") == b'{"run_id": "abc"}'
        waiting = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
        assert waiting, caplog.text
        assert re.fullmatch(
            rf"object store s3://{store.bucket} unreachable for \d+ s; retrying until \d+ s",
            waiting[0],
        ), waiting
        assert lease.holder().pid == os.getpid()  # the lease was renewed once the store was back
    finally:
        lease.release()
    assert lease.holder() is None


@pytest.mark.slow
@HEAVY_IO
def test_an_outage_past_the_lease_is_store_unavailable_and_release_does_not_wait(store):
    lease = S3Lease(store.uri("run"), lease_seconds=6)
    lease.acquire()
    folder = open_store(store.uri("run"))
    store.pause()
    try:
        with pytest.raises(StoreUnavailable) as raised:
            folder.write("run.json", b"{}")
        message = str(raised.value)
        assert f"Object store s3://{store.bucket} unreachable for" in message
        assert "run the same command again" in message and "resumes" in message
        assert raised.value.exit_code == 75
        lease.release()  # returns with the server still stopped: nothing waits on it
        released = time.time()
        assert lease.owner is None
    finally:
        store.resume()
    # The lease was left to lapse (its holder could not reach the store to delete it). A renewal
    # the heartbeat sent during the outage may still land after the resume: the server reads the
    # request from its socket after the client gave up on it. It was sent before the release, so
    # the lease lapses at most lease_seconds after the release, and a new run takes it over then.
    time.sleep(max(0.0, released + 6 - time.time()) + 0.5)
    stale = lease.holder()
    assert stale is not None and stale.pid == os.getpid()
    assert stale.expires <= released + 6
    again = S3Lease(store.uri("run"), lease_seconds=6)
    again.acquire()
    again.release()


# -- the whole training, through the CLI ---------------------------------------------------------

EPOCHS = 6
STEPS = 40  # digits: 1,257 training rows in batches of 32
# The outage: 45 s, half of a 90 s lease (renewed every 30 s: an outage is ridden out
# until at least 60 s after it began). Twice a 40 s lease for the outage that stops the run.
HALF_LEASE, LEASE = 90, 40


def _command(table: str, run_dir: str, tmp: Path, lease: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipes.digits",
        *("--set", f"data.table={table}"),
        *("--set", f"train.epochs={EPOCHS}"),
        *("--set", f"runtime.run_dir={run_dir}"),
        *("--set", f"runtime.lease_seconds={lease}"),
        *("--set", f"tracking.uri={seed_store(tmp / 'mlflow.db')}"),
        *("--set", "tracking.log_model=false"),
        *("--set", "data.deterministic=true"),
        *("--set", "callbacks.checkpoint_every_n_steps=10"),
        *("--set", "callbacks.plots=false"),
    ]


def _run_pausing(store: PausableStore, cmd: list[str], log: Path, seconds: float):
    """Run ``cmd``; once its first checkpoint past epoch 1 counts, pause the store for
    ``seconds``. Returns ``(exit code, output)`` once it ended and the store is back."""
    client = boto3.client("s3")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}

    def past_first_epoch() -> bool:
        listed = client.list_objects_v2(Bucket=store.bucket, Prefix="runs/digits/checkpoints/")
        names = [o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", [])]
        return any(int(n[5:14]) > STEPS for n in names if re.fullmatch(r"ckpt-\d{9}\.json", n))

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not past_first_epoch():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint past the first epoch"
                time.sleep(0.1)
            store.pause_for(seconds)
            code = proc.wait(timeout=600)
            store.wait_resumed()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return code, log.read_text()


def _notes(output: str) -> str:
    """The output without TensorFlow's and the progress bar's lines, on one line."""
    lines = [ln for ln in output.splitlines() if "step - " not in ln and "absl" not in ln]
    return " ".join(" ".join(lines).split())


def _epochs_logged_once(uri: str) -> mlflow.entities.Run:
    (run,) = runs_in(uri)
    client = mlflow.MlflowClient(uri)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == list(range(EPOCHS)), (key, steps)
    return run


@pytest.mark.slow
@HEAVY_IO
def test_training_rides_out_a_store_outage_of_half_the_lease(store, tmp_path):
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits

    table = store.uri("digits")
    ingest_sklearn_digits(table, rows_per_group=256)
    cmd = _command(table, store.uri("runs/digits"), tmp_path, HALF_LEASE)
    code, output = _run_pausing(store, cmd, tmp_path / "train.log", HALF_LEASE / 2)
    notes = _notes(output)
    assert code == 0, notes[-3000:]
    assert "Traceback" not in output
    # It waited (past the AWS SDK's own attempts), saying so.
    assert re.search(rf"object store s3://{store.bucket} unreachable for \d+ s; retrying", notes), (
        notes[-3000:]
    )
    run = _epochs_logged_once(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.info.status == "FINISHED"


@pytest.mark.slow
@HEAVY_IO
def test_an_outage_of_twice_the_lease_exits_75_killed_and_a_rerun_resumes(store, tmp_path):
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits

    table = store.uri("digits")
    ingest_sklearn_digits(table, rows_per_group=256)
    cmd = _command(table, store.uri("runs/digits"), tmp_path, LEASE)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code, output = _run_pausing(store, cmd, tmp_path / "first.log", 2 * LEASE)
    notes = _notes(output)
    assert code == 75, notes[-3000:]
    assert "Traceback" not in output, notes[-3000:]
    assert f"error: Object store s3://{store.bucket} unreachable for" in notes, notes[-3000:]
    assert "run the same command again" in notes and "resumes" in notes
    assert re.search(rf"object store s3://{store.bucket} unreachable for \d+ s; retrying", notes)
    (run,) = runs_in(uri)
    assert run.info.status == "KILLED"

    # The store is back: the same command resumes the same run (the old lease lapsed as the
    # run gave up: it waited exactly until then).
    resumed = subprocess.run(
        cmd,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from checkpoint" in resumed.stdout + resumed.stderr
    assert _epochs_logged_once(uri).info.status == "FINISHED"


@pytest.mark.slow
@HEAVY
def test_on_two_horovod_ranks_an_outage_past_the_lease_still_exits_75_killed(store, tmp_path):
    """Each rank gives up at the lease's expiry; the driver reports that, not a failed rank."""
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits

    table = store.uri("digits")
    ingest_sklearn_digits(table, rows_per_group=256)
    cmd = [*_command(table, store.uri("runs/digits"), tmp_path, LEASE)]
    cmd += ["--set", "runtime.np=-2", "--set", "runtime.strategy=horovod"]
    code, output = _run_pausing(store, cmd, tmp_path / "ranks.log", 2 * LEASE)
    notes = _notes(output)
    assert code == 75, notes[-3000:]
    assert f"error: Object store s3://{store.bucket} unreachable for" in notes, notes[-3000:]
    error = notes[notes.rindex(f"error: Object store s3://{store.bucket}") :]
    assert "Horovod rank" not in error, notes[-3000:]
    # The ranks waited as long as the launcher's lease (not the default 60 s of no lease).
    assert "longer than the time the run's lease on runtime.run_dir stays valid" in error, error
    (run,) = runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.info.status == "KILLED", run.data.tags
    assert run.data.tags.get("preempted") == "STORE_UNAVAILABLE", run.data.tags
