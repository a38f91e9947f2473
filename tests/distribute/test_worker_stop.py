"""SIGTERM/SIGINT to a multi-worker Spark job's driver become a stop marker its tasks read
(keras_dl.launch.worker_stop), in process: the loopback-cluster test is
tests/distribute/test_resume_spark.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
