"""How a rank that left no report of its own died: its exit status, the kernel's log, and the
last words a native abort printed. The OOM killer is named only when the evidence says so: the
kernel's log names the rank's process, or (when that log cannot be read) the exit was SIGKILL,
the only signal the OOM killer sends. A SIGABRT (Gloo, a failed C++ check) is not memory.
"""

from __future__ import annotations

import signal
import socket

from keras_dl.distribute.kernel_log import oom_kills
from keras_dl.distribute.network_errors import RankPlace


def on_host(places: dict[int, RankPlace], rank: int) -> str:
    """The words ' on host H (pid P)' for a rank that wrote its start line, else nothing."""
    place = places.get(rank)
    return f" on host {place.host} (pid {place.pid})" if place else ""


def describe_death(
    rank: int,
    code: int | None,
    places: dict[int, RankPlace],
    outputs: dict[int, list[str]],
    started: float | None,
) -> str:
    """What the evidence says of a rank's death: the OOM killer only when the kernel's log or
    a SIGKILL says so; a native abort's own last words otherwise."""
    sigkill = code in (-9, 128 + 9)
    place = places.get(rank)
    if place is not None and place.host == socket.gethostname():
        found = oom_kills({place.pid}, since=started)
        if found.lines:
            return (
                f" The kernel's OOM killer killed its process {place.pid} ({found.source}: "
                f"{found.lines[0]!r}): the host ran out of memory. Give it more memory, or run "
                "fewer ranks on it or smaller batches."
            )
        if found.readable and sigkill:
            return (
                f" It was not the OOM killer: the kernel's log ({found.source}) has no "
                f"out-of-memory kill of its process {place.pid} since the job started. Something "
                "else sent SIGKILL (kill -9, a container runtime, Spark stopping its executor)."
            )
        if sigkill:
            return (
                " SIGKILL is what the OOM killer sends, and the kernel's log could not be read to "
                f"tell ({found.error}): run dmesg as root and look for 'Killed process "
                f"{place.pid}', and check the machine's memory."
            )
    elif sigkill:
        where = f"host {place.host}'s" if place else "its host's"
        pid = f" {place.pid}" if place else ""
        return (
            f" SIGKILL is what the OOM killer sends: {where} kernel log (dmesg, as root) says "
            f"whether it killed the process{pid} ('Out of memory: Killed process{pid}')."
        )
    last = _native_last_words(outputs.get(rank, ()))
    return f" Its last words: {last!r}." if last else ""


def describe_exit(code: int | None) -> str:
    """E.g. 'killed by signal 9 (SIGKILL)' for -9 or 137, else 'exit status 1'; None (Horovod's
    Spark launcher got no exit code) is a task whose executor or host went away."""
    if code is None:
        return (
            "its Spark task ended without an exit code (the executor process, or its host, went "
            "away: check the Spark UI's executors page and the worker's log for it)"
        )
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig:
        try:
            return f"killed by signal {sig} ({signal.Signals(sig).name})"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit status {code}"


# -- private helpers ---------------------------------------------------------------------------


def _native_last_words(lines) -> str:
    """The line a native abort left (``what():  ...``, else ``terminate called ...``), or
    nothing."""
    what = [x.strip() for x in lines if "what():" in x]
    return what[-1] if what else next((x.strip() for x in lines if "terminate called" in x), "")
