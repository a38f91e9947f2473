"""A warm interpreter the suite's Python subprocesses fork from, instead of each importing
TensorFlow, Keras and MLflow anew (about 5 CPU-s a process, some 500 processes a run).

Linux process accounting of a whole run showed the suite spends
half its CPU in Python processes the tests start: CLI runs, Horovod ranks, Spark's Python
daemons, scaling workers, barrier ranks. Most of that is their imports. So each xdist worker
starts one server (:func:`start`, :mod:`tests.warm_python_server`) that imports them once and then forks a child per command;
``sys.executable`` in the worker, and in every child, is a launcher that runs
:mod:`tests.warm_python_client`, so a command started the usual way (``[sys.executable, "-m",
...]``, Horovod's ``executable``, ``PYSPARK_PYTHON``) runs in such a child. The child is a real
process running the real command: its own PID, the caller's standard streams, environment and
working directory, its exit status or signal passed back, interpreter shutdown (``atexit``,
MLflow ending its run) as usual. Only the imports it shares were done before it started.

Refused (run cold, on the real interpreter, as a fresh process): interpreter options, a
process that leads its own group (whose Python subprocesses are served:
:mod:`tests.warm_python_leader`), a ``PYTHONPATH`` other than the server's (but for the zips and
jars of the pyspark it imported, which Spark's daemons put first), a ``PYTHONHASHSEED`` other
than 0 (the server's), and any environment variable read at import time (CPython's
``PYTHON*``, ``TF_*``, ``KERAS_BACKEND``, ``KERAS_HOME``, ``CUDA*``, ``LD_*``, thread counts,
``HOME``) that differs from the server's. Tests of a fresh interpreter itself use
:data:`REAL_PYTHON`. ``KERAS_DL_COLD_PYTHON=1`` turns the server off for a run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The interpreter itself (sys.executable is the launcher in the workers and their children).
REAL_PYTHON = next(
    (p for p in (os.path.join(sys.prefix, "bin", "python"),) if os.access(p, os.X_OK)),
    sys.executable,
)


def start() -> subprocess.Popen | None:
    """This process's server, and ``sys.executable`` pointed at its launcher."""
    if os.environ.get("KERAS_DL_COLD_PYTHON"):
        return None
    _settle_the_environment()
    folder = tempfile.mkdtemp(prefix="warm-python-")
    path, launcher = f"{folder}/server.sock", f"{folder}/python"
    Path(launcher).write_text(
        f"#!{REAL_PYTHON} -S\n"
        "import sys\n"
        f"sys.path[0] = {str(REPO / 'tests')!r}\n"
        "import warm_python_client\n"
        f"warm_python_client.main({path!r}, {REAL_PYTHON!r})\n"
    )
    os.chmod(launcher, 0o755)
    env = {
        **os.environ,
        "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO),
        # Its children hash strings as seed 0 does, what Spark asks of its Python workers
        # (tests/warm_python_server.py HASH_SEEDS): their partitions of strings agree.
        "PYTHONHASHSEED": "0",
    }
    with open(f"{folder}/server.log", "a") as log:  # the launchers append to it too
        server = subprocess.Popen(
            [REAL_PYTHON, "-m", "tests.warm_python_server", path, launcher],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
        )
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the warm python server did not start: {folder}/server.log")
        time.sleep(0.1)
    sys.executable = launcher
    server.folder = folder
    return server


def _settle_the_environment() -> None:
    """Import, before the server copies this process's environment, what changes
    ``os.environ`` when first imported: OpenCV's ``cv2`` puts its library folder on
    ``LD_LIBRARY_PATH`` (for subprocesses). Imported later by a test (an image example, a JPEG
    codec), it made every command this process started afterwards differ from the server in
    an import-time variable and run cold, with every rank or worker those started. A command
    that imports ``cv2`` itself still sets it for its own subprocesses, as a cold one would."""
    try:
        import cv2  # noqa: F401
    except ImportError:  # not installed: nothing of it to settle
        pass


def real_pid(pid: int) -> int:
    """The process that runs the command a launcher process ``pid`` started (``Popen.pid`` of
    a warm command is its launcher's): what the command itself sees as ``os.getpid()``."""
    folder = os.path.dirname(sys.executable)
    try:
        return int(Path(folder, f"pid.{pid}").read_text())
    except (OSError, ValueError):
        return pid  # a cold command, or no server


def wait_ended(proc: subprocess.Popen, timeout: float = 60) -> None:
    """After ``proc`` (a launcher) was killed and waited for: wait until its command's process
    is gone too (the server kills it when the launcher dies; a cold command is gone already)."""
    pid, deadline = real_pid(proc.pid), time.monotonic() + timeout
    while pid != proc.pid and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)


def stop(server: subprocess.Popen | None) -> None:
    """End the server (it kills what is left of its children); its log, with the commands it
    ran cold and why, is appended to ``$KERAS_DL_WARM_PYTHON_LOG`` if that is set."""
    if server is None:
        return
    server.stdin.close()
    server.wait(timeout=60)
    keep = os.environ.get("KERAS_DL_WARM_PYTHON_LOG")
    if keep:
        with open(keep, "a") as out:
            out.write(Path(server.folder, "server.log").read_text())
    shutil.rmtree(server.folder, ignore_errors=True)
