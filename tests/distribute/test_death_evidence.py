"""A rank that died without a report: the OOM killer is named only when the evidence says so.

The deaths are real: a process the kernel's OOM killer kills in a memory cgroup of 64 MB, a
process killed by ``kill -9``, and Gloo's abort captured from a real rank
(tests/distribute/test_network_errors.py reproduces it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keras_dl.distribute.failures import explain_failure
from keras_dl.distribute.kernel_log import KMSG, job_clock, oom_kills, parse_kmsg
from tests.conftest import REPO
from tests.distribute.test_failure_messages import HOROVOD, SHUTDOWN

# A rank's stderr as Horovod's local launcher kept it, captured from a real rank whose peer
# offered 127.0.0.1 (Horovod 0.28.1, the unpatched path: every rank's interface lo).
GLOO_ABORT = (
    "keras_dl rank started: rank=0 host=vm pid=17809 iface=lo address=127.0.0.1 hostname=hosta\n"
    "terminate called after throwing an instance of 'gloo::IoException'\n"
    "  what():  [/tmp/tmp.uOjuoas9Fp/horovod-0.28.1/third_party/compatible17_gloo/gloo/transport/"
    "tcp/pair.cc:799] connect [127.0.0.1]:63906: Connection refused\n"
)
# A rank that raised a Python error in native code's stead: its C++ check, then SIGABRT.
NATIVE_ABORT = (
    "keras_dl rank started: rank=1 host=vm pid=4242 iface=- address=- hostname=localhost\n"
    "terminate called after throwing an instance of 'std::logic_error'\n"
    "  what():  Different ranks tried to set up mismatching numbers of process sets\n"
)
CHILD = (
    "import os, sys\n"
    "from keras_dl.distribute.network_errors import report_rank_start\n"
    "report_rank_start()\n"
    "sys.stdin.read(1)\n"
    "if sys.argv[1] != 'wait':  # join the 64 MB cgroup, then write 256 MB (charged to it)\n"
    "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "    x = b'\\x01' * (256 << 20)\n"
    "else: sys.stdin.read()\n"
)


def _needs(ok: bool, why: str) -> None:
    """Skip where the machine cannot, but fail under CI=true (CI runs as root)."""
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def _rank_logs(tmp_path: Path, outputs: dict[int, str]) -> str:
    for rank, text in outputs.items():
        (tmp_path / f"rank.{rank}").mkdir(exist_ok=True)
        (tmp_path / f"rank.{rank}" / "stderr").write_text(text)
    return str(tmp_path)


def _memory_cgroup(tmp_name: str) -> Path | None:
    """A new child of this process's v1 memory cgroup, or None where there is none to write."""
    try:
        own = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.split(":")[1] == "memory"
        )
    except (StopIteration, IndexError, OSError):
        return None
    group = Path("/sys/fs/cgroup/memory" + own) / tmp_name
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(64 << 20))
    except OSError:
        return None
    return group


def _rank_process(mode: str, log: Path) -> subprocess.Popen:
    """A process that writes a rank's start line, then waits (``mode`` "wait") or joins the
    cgroup whose ``cgroup.procs`` file ``mode`` is and runs out of its memory."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOROVOD_RANK": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE, stderr=err, env=env
        )
    proc.stdin.write(b"x")
    proc.stdin.flush()
    return proc


def test_a_rank_the_oom_killer_killed_is_named_from_the_kernels_log(tmp_path):
    group = _memory_cgroup(f"errors-oom-{os.getpid()}")
    _needs(group is not None, "no writable memory cgroup (cgroup v1, as root) to run out of")
    _needs(oom_kills(set()).readable, f"the kernel's log ({KMSG}, dmesg) is not readable")
    started = job_clock()
    (tmp_path / "rank.1").mkdir()
    try:
        proc = _rank_process(str(group / "cgroup.procs"), tmp_path / "rank.1" / "stderr")
        proc.stdin.close()
        code = proc.wait(timeout=60)
    finally:
        group.rmdir()
    assert code == -signal.SIGKILL
    (tmp_path / "rank.0").mkdir()
    (tmp_path / "rank.0" / "stderr").write_text(
        f"x\nkeras_dl rank failed: rank=0 secondary=1 cause={SHUTDOWN}\n"
    )
    # The rank's own process id, from its start line (sys.executable may be a launcher).
    pid = int(re.search(r"pid=(\d+)", (tmp_path / "rank.1" / "stderr").read_text()).group(1))
    exc = RuntimeError(HOROVOD.format(rank=1, code=137))
    message = str(explain_failure(exc, str(tmp_path), size=2, started=started))
    assert (
        f"rank 1 died: killed by signal 9 (SIGKILL) on host {os.uname().nodename} (pid {pid})"
        in message
    )
    assert f"The kernel's OOM killer killed its process {pid} (/dev/kmsg: " in message, message
    assert f"Killed process {pid} (python" in message, message
    # Kernel records from before the job started are not this job's.
    assert not oom_kills({pid}, since=job_clock() + 60).lines


def test_a_rank_killed_by_kill_9_is_not_called_out_of_memory(tmp_path):
    _needs(oom_kills(set()).readable, f"the kernel's log ({KMSG}, dmesg) is not readable")
    started = job_clock()
    (tmp_path / "rank.1").mkdir()
    proc = _rank_process("wait", tmp_path / "rank.1" / "stderr")
    while "rank started" not in (tmp_path / "rank.1" / "stderr").read_text():
        pass
    pid = int(re.search(r"pid=(\d+)", (tmp_path / "rank.1" / "stderr").read_text()).group(1))
    os.kill(pid, signal.SIGKILL)  # the rank itself (sys.executable may be a launcher)
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    exc = RuntimeError(HOROVOD.format(rank=1, code=-9))
    message = str(explain_failure(exc, str(tmp_path), size=2, started=started))
    assert "died: killed by signal 9 (SIGKILL)" in message
    assert (
        "It was not the OOM killer: the kernel's log (/dev/kmsg) has no out-of-memory kill "
        in message
    )
    assert f"of its process {pid} since the job started" in message


def test_a_gloo_abort_is_a_network_failure_not_memory(tmp_path):
    """The issue's case: Gloo's SIGABRT ended with "check the machine's memory (the OOM killer)"."""
    exc = RuntimeError(HOROVOD.format(rank=0, code=134))
    message = str(explain_failure(exc, _rank_logs(tmp_path, {0: GLOO_ABORT}), size=2))
    assert "memory" not in message and "OOM" not in message, message
    assert message.startswith(
        "Horovod rank 0 on host vm could not connect to its peer at 127.0.0.1"
    )


@pytest.mark.parametrize(("code", "first"), [(-6, 1), (134, 0)])
def test_a_native_abort_is_described_as_it_is(tmp_path, code, first):
    """SIGABRT, reported first (-6 from Spark's launcher, 134 from a shell) or not: no memory."""
    outputs = {1: NATIVE_ABORT}
    if first == 0:  # the other rank exited first, stopped by the shutdown
        outputs[0] = f"keras_dl rank failed: rank=0 secondary=1 cause={SHUTDOWN}\n"
    exc = RuntimeError(HOROVOD.format(rank=first, code=code))
    message = str(explain_failure(exc, _rank_logs(tmp_path, outputs), size=2))
    assert "memory" not in message and "OOM" not in message, message
    assert "on host vm (pid 4242), so the job was stopped" in message
    assert "Its last words: 'what():  Different ranks tried to set up mismatching" in message
    if first == 1:
        assert "killed by signal 6 (SIGABRT)" in message


def test_an_unreadable_kernel_log_is_said_and_sigkill_still_hints_at_memory(tmp_path):
    """Another host's rank: its kernel log is not this host's; SIGKILL is the only evidence."""
    start = "keras_dl rank started: rank=1 host=elsewhere pid=77 iface=eth0 address=10.0.0.2 hostname=-\n"
    exc = RuntimeError(HOROVOD.format(rank=1, code=-9))
    message = str(explain_failure(exc, _rank_logs(tmp_path, {1: start}), size=2))
    assert (
        "SIGKILL is what the OOM killer sends: host elsewhere's kernel log (dmesg, as root)"
        in message
    )
    assert "'Out of memory: Killed process 77'" in message
    # Without SIGKILL, nothing about memory.
    exc = RuntimeError(HOROVOD.format(rank=1, code=1))
    message = str(explain_failure(exc, _rank_logs(tmp_path, {1: start}), size=2))
    assert "died: exit status 1" in message and "memory" not in message


def test_kmsg_records_are_parsed():
    stamp, text = parse_kmsg(
        "6,1234,1048370504,-;Memory cgroup out of memory: Killed process 18877 (python3)\n SUBSYSTEM=x"
    )
    assert stamp == pytest.approx(1048.370504) and text.startswith("Memory cgroup out of memory")
