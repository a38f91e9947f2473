"""SIGTERM/SIGINT to a multi-worker Spark job's driver become a stop marker its tasks read
(keras_dl.launch.worker_stop), in process: the loopback-cluster test is
tests/distribute/test_resume_spark.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from keras_dl.errors import PREEMPTED_EXIT
from keras_dl.launch.rank_output import RankOutputWriter
from keras_dl.launch.worker_stop import STOP, StopWatch, stop_on_signal


def _wait_for(path, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_the_first_signal_asks_the_workers_and_a_second_does_what_it_did_before(tmp_path):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with stop_on_signal(str(tmp_path)):
            os.kill(os.getpid(), signal.SIGTERM)
            assert _wait_for(tmp_path / STOP)  # the marker the tasks list
            assert seen == []  # this process goes on: it waits for the workers' ends
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            assert seen == [signal.SIGTERM]  # the handler it had before
        assert signal.getsignal(signal.SIGTERM) is not None
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_task_sends_its_worker_sigterm_once_the_marker_is_there(tmp_path):
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\ntime.sleep(60)",
        ]
    )
    try:
        watch = StopWatch(str(tmp_path), 1, worker)
        time.sleep(1.5)
        assert worker.poll() is None  # no marker, no signal
        (tmp_path / STOP).write_bytes(b"")
        assert worker.wait(timeout=10) == 75
        assert watch.asked
    finally:
        worker.kill()


@pytest.fixture
def silent_store(monkeypatch):
    """An S3 endpoint on loopback that takes connections and never answers (a store a host can
    no longer reach, as far as a client can tell): every call waits out its timeouts."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)  # the kernel completes the handshakes; nothing reads the requests
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "silent")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "silent")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        yield "s3://silent-store/out"


@contextlib.contextmanager
def _exited(code: int):
    worker = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    worker.wait()
    yield worker


def test_a_failed_tasks_end_does_not_wait_on_a_store_it_cannot_reach(silent_store):
    """The chief's failed task, and a task whose worker stopped because the store was
    unreachable from its host, go on to fail (their report is the driver's cause) at once: a
    call to this store takes a request timeout at least, and keras_dl's retries a minute."""
    with _exited(PREEMPTED_EXIT) as worker:
        for rank, store_lost in ((0, False), (1, True)):
            watch = StopWatch(silent_store, rank, worker)
            start = time.monotonic()
            watch.ended(PREEMPTED_EXIT, store_lost=store_lost)
            assert time.monotonic() - start < 1.0, (rank, store_lost)

    writer = RankOutputWriter(silent_store, 0)  # not started: its start marker would wait
    writer.add("[0]<stderr>:keras_dl rank failed: rank=0 secondary=0 cause=...\n")
    start = time.monotonic()
    writer.close(timeout=0.5)
    assert time.monotonic() - start < 1.5
