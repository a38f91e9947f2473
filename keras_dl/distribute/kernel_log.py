"""The kernel's word on a killed process: did the OOM killer kill it?

A rank killed by SIGKILL leaves no report of its own. The OOM killer sends SIGKILL, but so does
anything else (``kill -9``, a container runtime, a Spark executor torn down): only the kernel's
log says which. It is read from ``/dev/kmsg`` (one record per ``read``; readable by root, or
when ``kernel.dmesg_restrict`` is 0), else from ``dmesg``. Only records written after the job
started count, and only those naming one of the rank's process ids.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from dataclasses import dataclass

KMSG = "/dev/kmsg"
# mm/oom_kill.c: "Out of memory: Killed process 1234 (python) total-vm:..." (and "Memory cgroup
# out of memory: Killed process ..."), and since 4.19 "oom-kill:constraint=...,task=python,
# pid=1234,uid=0". The first names the process in every kernel version that has either.
_KILLED_RE = re.compile(r"Killed process (\d+) \(")
_OOM_KILL_RE = re.compile(r"oom-kill:.*\bpid=(\d+)")


@dataclass(frozen=True)
class OomEvidence:
    """What the kernel's log says about some process ids.

    Attributes:
        source: What was read: ``/dev/kmsg``, ``dmesg``, or "" when neither could be.
        lines: The log's out-of-memory lines for those ids since the job started (empty: none).
        error: Why the log could not be read ("" when it was).
    """

    source: str
    lines: tuple[str, ...]
    error: str = ""

    @property
    def readable(self) -> bool:
        return bool(self.source)


def job_clock() -> float:
    """Now on the clock the kernel stamps its log with (seconds since boot): a job's start,
    to give :func:`oom_kills`."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def oom_kills(pids: set[int], since: float | None = None) -> OomEvidence:
    """The kernel log's out-of-memory kills of any of ``pids`` after ``since`` (a
    :func:`job_clock` reading; None: any time since boot)."""
    records, source, error = _read_kmsg()
    if not source:
        records, source, dmesg_error = _read_dmesg()
        error = "" if source else f"{error}; {dmesg_error}"
    if not source:
        return OomEvidence("", (), error)
    lines = []
    for stamp, text in records:
        if since is not None and stamp is not None and stamp < since - 1.0:
            continue
        m = _KILLED_RE.search(text) or _OOM_KILL_RE.search(text)
        if m and int(m.group(1)) in pids:
            lines.append(text.strip())
    # "Killed process P (name) total-vm:... anon-rss:..." first: it says how much it held.
    lines.sort(key=lambda line: _KILLED_RE.search(line) is None)
    return OomEvidence(source, tuple(lines))


def parse_kmsg(record: str) -> tuple[float | None, str]:
    """``(seconds since boot, message)`` of one ``/dev/kmsg`` record
    ("prio,seq,usec,flags;message" and continuation lines)."""
    head, _, message = record.partition(";")
    fields = head.split(",")
    try:
        stamp = int(fields[2]) / 1e6
    except (IndexError, ValueError):
        return None, record
    return stamp, message.split("\n", 1)[0]


# -- private helpers ---------------------------------------------------------------------------


def _read_kmsg() -> tuple[list[tuple[float | None, str]], str, str]:
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return [], "", f"{KMSG}: {exc.strerror}"
    records = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record overwritten while reading: go on
                    continue
                return [], "", f"{KMSG}: {exc.strerror}"
            if not chunk:
                break
            records.append(parse_kmsg(chunk.decode(errors="replace")))
    finally:
        os.close(fd)
    return records, KMSG, ""


_DMESG_RE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def _read_dmesg() -> tuple[list[tuple[float | None, str]], str, str]:
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], "", f"dmesg: {exc}"
    if proc.returncode != 0:
        return [], "", f"dmesg: {proc.stderr.strip() or f'exit status {proc.returncode}'}"
    records = []
    for line in proc.stdout.splitlines():
        m = _DMESG_RE.match(line)
        records.append((float(m.group(1)), m.group(2)) if m else (None, line))
    return records, "dmesg", ""
