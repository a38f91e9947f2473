"""CPU seconds per test, to find where the suite's time goes on a machine whose cores are all busy.

``KERAS_DL_CPU_REPORT=cpu.tsv pytest -p tests.cpu_report ...`` appends one line per test to
``cpu.tsv`` (every xdist worker appends to the same file): its node id, its CPU seconds, its
wall seconds (setup and teardown included), when it started (Unix time) and the xdist worker. ``python -m tests.cpu_report cpu.tsv`` prints the
tests and files that used the most.

On 2 busy cores a test's wall time measures how many others ran beside it as much as the test;
its CPU does not. A test's CPU is the pytest process's own, plus its descendants' while it ran:
the children it waited for, and each live descendant's CPU since the test began (with that
descendant's own children): the session's Spark JVMs, servers and Spark's Python workers.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections import defaultdict

import pytest

REPORT_ENV = "KERAS_DL_CPU_REPORT"


def _cpu(times) -> float:
    return times.user + times.system + times.children_user + times.children_system


def _descendants() -> dict[int, float]:
    import psutil

    cpu = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cpu[(proc.pid, proc.create_time())] = _cpu(proc.cpu_times())
        except psutil.Error:  # it ended meanwhile: its parent counts it when it reaps it
            continue
    return cpu


def _own() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get(REPORT_ENV)
    if not path:
        yield
        return
    started, wall, own, before = time.time(), time.monotonic(), _own(), _descendants()
    yield
    after = _descendants()
    cpu = _own() - own + sum(c - before.get(key, 0.0) for key, c in after.items())
    with open(path, "a") as out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        out.write(
            f"{item.nodeid}\t{cpu:.2f}\t{time.monotonic() - wall:.2f}\t{started:.1f}\t{worker}\n"
        )


def summarize(path: str, top: int = 40) -> str:
    tests, files = [], defaultdict(float)
    with open(path) as report:
        for line in report:
            nodeid, cpu, wall = line.rstrip("\n").split("\t")[:3]
            tests.append((float(cpu), float(wall), nodeid))
            files[nodeid.split("::")[0]] += float(cpu)
    total = sum(c for c, _, _ in tests)
    lines = [f"{len(tests)} tests, {total:,.0f} CPU-s in all", "", "CPU-s  wall-s  test"]
    lines += [f"{c:6.1f} {w:7.1f}  {n}" for c, w, n in sorted(tests, reverse=True)[:top]]
    lines += ["", "CPU-s  file"]
    lines += [f"{c:6.1f}  {f}" for f, c in sorted(files.items(), key=lambda x: -x[1])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(sys.argv[1], *(int(a) for a in sys.argv[2:3])))
