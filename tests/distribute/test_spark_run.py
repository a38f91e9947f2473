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
