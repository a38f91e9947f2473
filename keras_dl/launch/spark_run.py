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

:func:`stream_task_output`: each line a rank writes reaches the driver as it is written. The
task service sends it at once (``safe_shell_exec.prefix_connection`` writes line by line), but
the driver's client read it with ``shutil.copyfileobj(StreamReader(sock.makefile("rb")),
stream)`` (``horovod/runner/common/util/network.py``, ``BasicClient._send_one``): copyfileobj
asks for 64 KiB and a buffered socket file returns only once it holds 64 KiB or the connection
ends. The lines came in 64 KiB bursts (236 epochs' lines within one second, a rank's start-up
lines minutes late, or only when the job ended).
"""

from __future__ import annotations

import codecs
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator

# How long a rank may take to stop once the job's first rank failed, before it is given up (its
# abort is a SIGTERM, then a SIGKILL 5 s later, from its task service).
ABORT_GRACE = 30.0
LOST_EXIT = 75  # what a given-up rank's command counts as: a host lost, rerun to resume
_CHUNK = 65536  # the most a rank's output read takes at once (what has arrived, up to this)


@contextlib.contextmanager
def stop_all_on_first_failure() -> Iterator[list]:
    """Within this block, a ``horovod.spark.run`` job stops every rank once one rank's process
    ends with a non-zero status (or its task service is lost), and says which rank it was.

    Yields the list of ranks given up as lost, ``(rank, host, seconds waited)``: empty unless a
    rank's host stopped answering (see :func:`_stopping_the_rest`)."""
    import horovod.spark.gloo_run as spark_gloo

    original = spark_gloo._exec_command_fn
    lost: list[tuple[int, str, float]] = []

    def exec_command_fn(*args, **kwargs):
        return _stopping_the_rest(original(*args, **kwargs), lost)

    spark_gloo._exec_command_fn = exec_command_fn  # gloo_run() looks it up in its module
    try:
        yield lost
    finally:
        spark_gloo._exec_command_fn = original


@contextlib.contextmanager
def stream_task_output() -> Iterator[None]:
    """Within this block, the driver writes each line of a rank's output (``horovod.spark.run``'s
    ``stdout=`` / ``stderr=`` streams) as soon as it arrives, and flushes the stream."""
    from horovod.runner.common.util import network

    original = network.BasicClient._send_one

    def send_one(self, addr, req, stream=None):
        if stream is None:  # every request but the two output streams: Horovod's own
            return original(self, addr, req)
        return _send_streaming(self, addr, req, stream, network.AckStreamResponse)

    network.BasicClient._send_one = send_one
    try:
        yield
    finally:
        network.BasicClient._send_one = original


def _send_streaming(client, addr, req, stream, ack) -> object:
    """``BasicClient._send_one`` for a request answered by a stream: the same wire and retries,
    but the stream is copied as it arrives (``read1``), whole lines at a time."""
    for attempt in range(client._attempts):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.connect(addr)
            rfile, wfile = sock.makefile("rb"), sock.makefile("wb")
            try:
                client._wire.write(req, wfile)
                resp = client._wire.read(rfile)
                if isinstance(resp, ack):
                    _copy_lines(rfile, stream)
                return resp
            finally:
                rfile.close()
                wfile.close()
        except Exception:
            if attempt == client._attempts - 1:
                raise
        finally:
            sock.close()
    return None


def _copy_lines(rfile, stream) -> None:
    """Write what ``rfile`` (UTF-8 bytes) brings to ``stream`` up to its last line end (a "\r"
    too: progress bars), flushing each time; the rest once the connection ends."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    while chunk := rfile.read1(_CHUNK):
        pending += decoder.decode(chunk)
        cut = max(pending.rfind("\n"), pending.rfind("\r")) + 1
        if cut:
            stream.write(pending[:cut])
            stream.flush()
            pending = pending[cut:]
    pending += decoder.decode(b"", final=True)
    if pending:
        stream.write(pending)
        stream.flush()


def _stopping_the_rest(exec_command, lost: list, grace: float | None = None):
    """``exec_command(command, slot_info, events)`` of one job, with one more event for every
    rank: set when a rank's command ends non-zero, it aborts the others' commands.

    A rank whose command has not ended ``grace`` seconds after that (its host unreachable: the
    abort itself waits on a connection that never answers) is given up: its command counts as
    ended with :data:`LOST_EXIT`, and it is added to ``lost`` for the launcher, which
    reports :class:`~keras_dl.errors.HostLost` (exit 75). Without this the driver waited for it
    for good (measured: still waiting 300 s after a host of the job lost its network).
    """
    stop = threading.Event()
    lock = threading.Lock()
    grace = ABORT_GRACE if grace is None else grace

    def run(command, slot_info, events):
        done: list = []
        worker = threading.Thread(
            target=lambda: done.append(
                _outcome(exec_command, command, slot_info, [*(events or []), stop])
            ),
            daemon=True,  # a command given up stays blocked on its dead host
        )
        worker.start()
        while worker.is_alive() and not stop.is_set():
            worker.join(0.5)
        worker.join(grace)
        if not done:
            with lock:
                lost.append((slot_info.rank, slot_info.hostname, grace))
            print(
                f"keras_dl: Horovod rank {slot_info.rank} on host {slot_info.hostname} did not "
                f"stop within {grace:.0f} s of the abort (its host unreachable): given up.",
                file=sys.stderr,
                flush=True,
            )
            return LOST_EXIT, time.time()
        exit_code, ended = _result(done[0])
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


def _outcome(exec_command, command, slot_info, events) -> tuple:
    try:
        return True, exec_command(command, slot_info, events)
    except BaseException as exc:  # re-raised in the thread Horovod runs the rank's command in
        return False, exc


def _result(outcome: tuple):
    ok, value = outcome
    if not ok:
        raise value
    return value
