"""keras_dl's changes to horovod.spark.run (keras_dl.launch.spark_run), on Horovod's own task
service and client in this process (the cluster test runs them under Spark)."""

from __future__ import annotations

import os
import sys
import time

from keras_dl.distribute.loopback import LOOPBACK, bound_to
from keras_dl.launch.spark_run import stream_task_output


class _Seen:
    """A text stream that notes when each line reached it."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.lines.extend((time.time(), line) for line in text.splitlines(keepends=True))
        return len(text)

    def flush(self) -> None:
        pass


def test_a_tasks_output_reaches_the_driver_line_by_line_as_it_is_written():
    from horovod.runner.common.service.task_service import BasicTaskClient, BasicTaskService
    from horovod.runner.common.util import secret

    key = secret.make_secret_key()
    with bound_to(LOOPBACK):
        service = BasicTaskService("keras_dl test task", 0, key, nics=None)
    try:
        loopback = {k: v for k, v in service.addresses().items() if v[0][0] == LOOPBACK}
        client = BasicTaskClient("keras_dl test task", loopback, key, verbose=0)
        seen = _Seen()
        command = (
            f"{sys.executable} -u -c \"import time; print('one'); time.sleep(3); "
            "print('two', time.time()); print('é' * 40000)\""
        )
        with stream_task_output():
            out, _ = client.stream_command_output(seen, None)
            client.run_command(command, dict(os.environ), capture_stdout=True)
            assert client.wait_for_command_exit_code() == 0
            out.join(30)
    finally:
        service.shutdown()
    lines = [line for _, line in seen.lines]
    assert lines[:2] == ["[0]<stdout>:one\n", lines[1]] and lines[1].startswith("[0]<stdout>:two ")
    assert lines[2:] == ["[0]<stdout>:" + "é" * 40000 + "\n"]  # whole, though over 64 KiB
    written = float(lines[1].split()[-1])
    assert seen.lines[0][0] < written  # the first line came 3 s before the second was written


def test_a_rank_that_does_not_stop_after_the_first_failure_is_given_up_as_lost():
    """Rank 1's command never ends (its host unreachable: even the abort waits on it) while
    rank 0's ends with exit 1: rank 1 counts as ended, lost, ``grace`` seconds later, where
    Horovod's launcher waited for it for good."""
    import threading
    from types import SimpleNamespace

    from keras_dl.launch.spark_run import LOST_EXIT, _stopping_the_rest

    never = threading.Event()
    aborted = []

    def exec_command(command, slot_info, events):
        if slot_info.rank == 0:
            return 1, time.time()
        while not never.wait(0.1):  # what rsh does: abort on an event, then wait for the host
            if any(e.is_set() for e in events) and not aborted:
                aborted.append(slot_info.rank)
        return 0, time.time()

    lost: list = []
    run = _stopping_the_rest(exec_command, lost, grace=1.0)
    results = {}
    threads = [
        threading.Thread(
            target=lambda r=r: results.__setitem__(
                r, run("cmd", SimpleNamespace(rank=r, hostname=f"h{r + 1}"), [])
            )
        )
        for r in (0, 1)
    ]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    never.set()
    assert results[0][0] == 1 and results[1][0] == LOST_EXIT
    assert aborted == [1]  # the stop event reached the other rank's command first
    assert lost == [(1, "h2", 1.0)]
    assert time.monotonic() - start < 20


def test_a_rank_that_stops_after_the_first_failure_is_not_lost():
    from types import SimpleNamespace

    from keras_dl.launch.spark_run import _stopping_the_rest

    def exec_command(command, slot_info, events):
        if slot_info.rank == 0:
            return 1, time.time()
        while not any(e.is_set() for e in events):
            time.sleep(0.05)
        return -15, time.time()  # aborted: SIGTERM

    lost: list = []
    run = _stopping_the_rest(exec_command, lost, grace=5.0)
    assert run("cmd", SimpleNamespace(rank=0, hostname="h1"), [])[0] == 1
    assert run("cmd", SimpleNamespace(rank=1, hostname="h2"), [])[0] == -15
    assert lost == []
