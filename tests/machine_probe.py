"""What the machine that ran the suite is like, printed in the run's last lines.

CI's machine is one we never log into, and it has run the same tree 1.0 to 1.9 times as long as
a fresh clone here, unevenly: a Horovod test 5 times as long, a Spark scoring test about the
same. The summary says which kind of work was slow there, beside the same figures from here:

- ``probe``, once as the run starts (before the workers load the machine) and once as it ends:
  a pure-Python loop (compute), touching fresh anonymous pages (page faults, which a nested VM
  pays the host for), ``fork`` and ``exec`` of ``/bin/true``, ``stat`` calls (syscalls) and
  round trips over a loopback TCP socket (Horovod's, Spark's and py4j's channel), and a fresh
  interpreter importing pandas and pyarrow (``import keras`` took twice its usual CPU here on a
  day the loop and the fault took their usual time);
- ``run``: the machine's CPU over the run from ``/proc/stat``: cores busy with user and system
  work, iowait and **steal** (time the hypervisor gave the machine's CPUs to someone else), page
  faults, context switches and processes started;
- ``host``: the kernel and the CPU model.

The probe takes about 2 s at each end. Linux only (``/proc``); elsewhere it prints
nothing.
"""

from __future__ import annotations

import mmap
import os
import platform
import socket
import subprocess
import sys
import threading
import time

_START: dict = {}


def probe() -> dict[str, float]:
    """Each kind of work's cost on this machine now (lower is faster)."""
    out = {}
    t = time.perf_counter()
    n = 0
    for i in range(2_000_000):
        n += i & 7
    out["python_loop_ms"] = 1000 * (time.perf_counter() - t)

    size = 128 << 20
    t = time.perf_counter()
    with mmap.mmap(-1, size) as m:
        for offset in range(0, size, mmap.PAGESIZE):
            m[offset] = 1
    out["fault_us"] = 1e6 * (time.perf_counter() - t) / (size // mmap.PAGESIZE)

    t = time.perf_counter()
    for _ in range(20):
        subprocess.run(["/bin/true"], check=True)
    out["spawn_ms"] = 1000 * (time.perf_counter() - t) / 20

    t = time.perf_counter()
    for _ in range(20_000):
        os.stat("/")
    out["stat_us"] = 1e6 * (time.perf_counter() - t) / 20_000

    out["loopback_rtt_us"] = _loopback_rtt_us(2_000)

    # A fresh interpreter importing pandas and pyarrow: what every cold test process pays, in
    # file-backed pages mapped and relocated (slow on days a plain loop and fault are not).
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import pandas, pyarrow"], check=True)
    out["import_ms"] = 1000 * (time.perf_counter() - t)
    return out


def _loopback_rtt_us(trips: int) -> float:
    server = socket.create_server(("127.0.0.1", 0))

    def echo():
        conn, _ = server.accept()
        with conn:
            for _ in range(trips):
                conn.sendall(conn.recv(1))

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    with socket.create_connection(server.getsockname()) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = time.perf_counter()
        for _ in range(trips):
            client.sendall(b"x")
            client.recv(1)
        elapsed = time.perf_counter() - t
    thread.join(5)
    server.close()
    return 1e6 * elapsed / trips


def counters() -> dict[str, float]:
    """The machine's cumulative CPU ticks by kind, page faults, context switches and forks."""
    out: dict[str, float] = {"wall": time.time()}
    with open("/proc/stat") as f:
        for line in f:
            key, *values = line.split()
            if key == "cpu":
                names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
                out.update({k: int(v) for k, v in zip(names, values)})
            elif key in ("ctxt", "processes"):
                out[key] = int(values[0])
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            if key == "pgfault":
                out["pgfault"] = int(value)
    return out


def start() -> None:
    """Probe the machine and read its counters: the run's first figures."""
    if not os.path.exists("/proc/stat"):
        return
    _START["probe"] = probe()
    _START["counters"] = counters()


def summary() -> list[str]:
    """The lines the run ends with (empty when :func:`start` did not run)."""
    if "counters" not in _START:
        return []
    end, begin = counters(), _START["counters"]
    ticks = os.sysconf("SC_CLK_TCK")
    wall = end["wall"] - begin["wall"]

    def cores(*keys: str) -> float:
        return sum(end[k] - begin[k] for k in keys) / ticks / wall

    lines = [
        f"host: {platform.release()}; {_cpu_model()}; {os.cpu_count()} CPUs",
        f"run: {wall:,.0f} s; cores busy: user {cores('user', 'nice'):.2f}, "
        f"system {cores('system', 'irq', 'softirq'):.2f}, iowait {cores('iowait'):.2f}, "
        f"steal {cores('steal'):.2f}, idle {cores('idle'):.2f}; "
        f"{(end['pgfault'] - begin['pgfault']) / 1e6:.1f} M page faults, "
        f"{(end['ctxt'] - begin['ctxt']) / 1e6:.1f} M context switches, "
        f"{end['processes'] - begin['processes']:,} processes started",
    ]
    for when, figures in (("start", _START["probe"]), ("end", probe())):
        lines.append(
            f"probe at the {when}: python loop {figures['python_loop_ms']:.0f} ms, "
            f"page fault {figures['fault_us']:.2f} us, spawn {figures['spawn_ms']:.2f} ms, "
            f"stat {figures['stat_us']:.2f} us, loopback round trip "
            f"{figures['loopback_rtt_us']:.1f} us, import pandas and pyarrow "
            f"{figures['import_ms']:.0f} ms"
        )
    return lines


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()
