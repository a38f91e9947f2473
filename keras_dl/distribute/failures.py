"""How a failed Horovod job is explained: which rank failed first, and why.

A rank that raises writes one marker line (then its traceback) to its stderr before it exits;
the launcher keeps a copy of every rank's output, and after Horovod reports "a process exited
non-zero" it reads the markers back to name the rank and the exception. A rank that was killed
leaves no marker: its exit status (a signal) is the cause.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import traceback
from pathlib import Path

from keras_dl.errors import DistributedError

_MARKER = "keras_dl rank failed:"
_MARKER_RE = re.compile(re.escape(_MARKER) + r" rank=(\d+) cause=(.*)")
# Ranks that fail *because* another rank died report Horovod's shutdown: not the cause.
_SECONDARY = ("Horovod has been shut down", "HorovodInternalError")


def report_failure(exc: BaseException) -> None:
    """On a rank: write the marker line and the traceback of ``exc`` to stderr, and flush."""
    rank = os.environ.get("HOROVOD_RANK", "?")
    cause = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
    sys.stderr.write(f"{_MARKER} rank={rank} cause={cause}\n")
    traceback.print_exc()
    sys.stderr.flush()
    sys.stdout.flush()


def explain_failure(exc: Exception, logs: str) -> DistributedError:
    """Turn Horovod's "a process exited non-zero" into an error naming the rank and the cause.

    Args:
        exc: What Horovod's launcher raised.
        logs: Folder holding a copy of every rank's output (searched recursively).
    """
    text = str(exc)
    causes: dict[int, str] = {}
    for f in Path(logs).rglob("*"):
        if f.is_file():
            for line in f.read_text(errors="replace").splitlines():
                m = _MARKER_RE.search(line)
                if m:
                    causes.setdefault(int(m.group(1)), m.group(2).strip())
    primary = {r: c for r, c in causes.items() if not any(s in c for s in _SECONDARY)}
    first = re.search(r"Process name: (\d+)\s+Exit code: (-?\d+)", text)
    first_rank = int(first.group(1)) if first else None
    if primary:
        rank = first_rank if first_rank in primary else min(primary)
        return DistributedError(
            f"Horovod rank {rank} failed: {primary[rank]} (its traceback is above, lines "
            f"prefixed [{rank}]). The other ranks were stopped."
        )
    if first:
        code = int(first.group(2))
        return DistributedError(
            f"Horovod rank {first_rank} died: {_describe_exit(code)}, so the job was stopped. "
            f"Check its output above (lines prefixed [{first_rank}]) and the machine's memory "
            "(the OOM killer)."
        )
    if causes:
        rank = min(causes)
        return DistributedError(f"Horovod rank {rank} failed: {causes[rank]}")
    if "Spark job has failed" in text:
        return DistributedError(
            "A Spark task failed before its Horovod rank started (the Python traceback is "
            "above). Check that the executors' Python (PYSPARK_PYTHON, now "
            f"{os.environ.get('PYSPARK_PYTHON', 'python3 from PATH')!r}) has keras_dl's "
            "dependencies, Horovod included."
        )
    if "Timed out" in text or "timeout" in text.lower():
        return DistributedError(
            f"The Horovod ranks did not all start: {text.strip()} Check that the cluster has "
            "enough free task slots, or raise runtime.start_timeout."
        )
    return DistributedError(f"The Horovod job failed: {type(exc).__name__}: {text.strip()}")


def _describe_exit(code: int) -> str:
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig:
        try:
            return f"killed by signal {sig} ({signal.Signals(sig).name})"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit status {code}"
