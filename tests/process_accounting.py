"""Every process's CPU in a run of the suite, from Linux's process accounting, beside the CPU
``tests/cpu_report.py`` gave the tests: what the suite's CPU is spent on outside any test.

``tests/cpu_report.py`` sees a test's own process and its live descendants; a process that
outlives the parent that started it (an orphan, reaped by init) or runs between tests is in no
test. Linux's BSD process accounting writes one record per process when it exits (its parent,
start, lifetime and CPU). Run as root, where the kernel has ``CONFIG_BSD_PROCESS_ACCT``::

    python -m tests.process_accounting run /tmp/ci            # a fresh clone's `make test`
    python -m tests.process_accounting report /tmp/ci

``run`` starts ``make test`` of the clone in a new PID namespace (``unshare``), so the records
are the run's alone, with accounting on into ``<clone>.pacct`` and ``tests/cpu_report.py``
into ``<clone>.cpu``. ``report`` prints the CPU of the run's processes by kind: the xdist
workers' own, their descendants' by command, orphans', and the rest (the setup).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

RECORD = struct.Struct("<BBHIIIIIIf8H16s")  # struct acct_v3 (linux/acct.h): 64 bytes
TICKS = 100  # AHZ: comp_t CPU times are in 1/100 s


def _comp(value: int) -> int:
    """A comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(path: str) -> list[dict]:
    data = Path(path).read_bytes()
    out = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, offset)
        out.append(
            {
                "pid": f[6],
                "ppid": f[7],
                "begin": f[8],
                "seconds": f[9] / TICKS,
                "cpu": (_comp(f[10]) + _comp(f[11])) / TICKS,
                "command": f[18].split(b"\0")[0].decode(errors="replace"),
            }
        )
    return out


def report(clone: str) -> str:
    procs = records(f"{clone}.pacct")
    by_pid = {}
    for p in procs:
        by_pid.setdefault(p["pid"], p)
    # The xdist controller: the parent of the longest-lived Python processes (its workers).
    longest = sorted((p for p in procs if p["command"] == "python"), key=lambda p: -p["seconds"])
    parents = defaultdict(int)
    for p in longest[:4]:
        parents[p["ppid"]] += 1
    controller = max(parents, key=parents.get)
    workers = {p["pid"] for p in procs if p["ppid"] == controller and p["command"] == "python"}

    def top(p: dict) -> dict:
        """The ancestor of ``p`` that init (the namespace's first process) adopted or started."""
        seen = 0
        while p["ppid"] not in (0, 1) and p["ppid"] in by_pid and seen < 64:
            p, seen = by_pid[p["ppid"]], seen + 1
        return p

    run_root = top(by_pid[controller])  # bash .ci/run: the setup, lint-imports, pytest

    def kind(p: dict) -> str:
        if p["pid"] in workers:
            return "xdist workers, their own"
        seen, parent = 0, p["ppid"]
        while parent not in (0, 1) and seen < 64:
            if parent in workers:
                return f"workers' descendants: {p['command']}"
            parent, seen = by_pid.get(parent, {}).get("ppid", 0), seen + 1
        if top(p) is run_root:
            return f"setup, import checks and the controller: {p['command']}"
        return f"orphans and their descendants: {top(p)['command']} > {p['command']}"

    cpu, count = defaultdict(float), defaultdict(int)
    for p in procs:
        cpu[kind(p)] += p["cpu"]
        count[kind(p)] += 1
    tests = Path(f"{clone}.cpu")
    attributed = sum(float(line.split("\t")[1]) for line in tests.open()) if tests.exists() else 0
    lines = [
        f"{len(procs)} processes, {sum(cpu.values()):,.0f} CPU-s; "
        f"tests/cpu_report.py gave the tests {attributed:,.0f}",
        "",
        "CPU-s  processes  kind",
    ]
    lines += [f"{c:7.1f} {count[k]:6d}  {k}" for k, c in sorted(cpu.items(), key=lambda x: -x[1])]
    return "\n".join(lines[:40])


def run(clone: str) -> int:
    pacct = Path(f"{clone}.pacct")
    pacct.touch()
    inner = (
        f"{sys.executable} -c 'import ctypes; ctypes.CDLL(None).acct(b\"{pacct}\")' && "
        f"cd {clone} && CI=true KERAS_DL_CPU_REPORT={clone}.cpu "
        "PYTEST_ADDOPTS='-p tests.cpu_report --durations=0' bash .ci/run; rc=$?; "
        f"{sys.executable} -c 'import ctypes; ctypes.CDLL(None).acct(None)'; exit $rc"
    )
    return subprocess.call(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", inner])


if __name__ == "__main__":
    action, clone = sys.argv[1], sys.argv[2].rstrip("/")
    if action == "run":
        sys.exit(run(clone))
    print(report(clone))
