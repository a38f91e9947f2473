"""Start ``python -m MODULE FOLDER``: a rank or worker process that reads its pickled ``payload``
from ``FOLDER``, with its output piped back as text (the Horovod rank of a Spark task, a
multi-worker worker on a Spark task or on this host)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path


def start_module(
    module: str, folder: str, payload: bytes | None, env: dict, *, die_with_parent: bool
) -> subprocess.Popen:
    """Write ``payload`` (unless None: already there) to ``FOLDER/payload`` and start the child.

    Args:
        die_with_parent: The child is SIGKILLed when this process dies (``PR_SET_PDEATHSIG``):
            a Spark task's child, so that a killed task (the stage ended) ends it.
    """
    if payload is not None:
        Path(folder, "payload").write_bytes(payload)
    return subprocess.Popen(
        [sys.executable, "-m", module, str(folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        preexec_fn=_die_with_parent if die_with_parent else None,
    )


def _die_with_parent() -> None:
    """In the child, before exec: die when the parent (the task's Python worker) dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: a killed task may leave its rank running
        pass
