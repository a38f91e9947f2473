"""What keras_dl changes in ``horovod.spark.run`` (a classic session's launcher) for one job.

:func:`stop_all_on_first_failure`: a rank whose process ends non-zero stops the others.
Horovod 0.28.1's own local launcher does this (``horovod/runner/gloo_run.py``,
``_exec_command_fn``'s ``terminate_all_event``); its Spark launcher does not
(``horovod/spark/gloo_run.py``, ``_exec_command_fn`` passes only the driver's signal event to
``rsh``), so after a rank died the job went on until every other rank ended by itself: at its next
collective with the dead peer if it noticed (seconds), else at the end of whatever it was doing
outside a collective (a long validation or checkpoint), or after ``runtime.stall_timeout``
(120 s) when the dead peer's connections stayed open. Stopping a rank is Horovod's
``abort_command`` to its task service: SIGTERM to the rank, SIGKILL 5 s later.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def stop_all_on_first_failure() -> Iterator[None]:
    """Within this block, a ``horovod.spark.run`` job stops every rank once one rank's process
    ends with a non-zero status (or its task service is lost), and says which rank it was."""
    import horovod.spark.gloo_run as spark_gloo

    original = spark_gloo._exec_command_fn

    def exec_command_fn(*args, **kwargs):
        return _stopping_the_rest(original(*args, **kwargs))

    spark_gloo._exec_command_fn = exec_command_fn  # gloo_run() looks it up in its module
    try:
        yield
    finally:
        spark_gloo._exec_command_fn = original


def _stopping_the_rest(exec_command):
    """``exec_command(command, slot_info, events)`` of one job, with one more event for every
    rank: set when a rank's command ends non-zero, it aborts the others' commands."""
    stop = threading.Event()
    lock = threading.Lock()

    def run(command, slot_info, events):
        exit_code, ended = exec_command(command, slot_info, [*(events or []), stop])
        if exit_code != 0:
            with lock:
                first = not stop.is_set()
                stop.set()
            if first:
                # The driver's own line: the rank named is the one that ended first.
                print(
                    f"keras_dl: Horovod rank {slot_info.rank} ended with exit status "
                    f"{exit_code}: stopping the other ranks.",
                    file=sys.stderr,
                    flush=True,
                )
        return exit_code, ended

    return run
