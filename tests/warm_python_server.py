"""The warm interpreter's server: it imports what the suite's subprocesses import, then forks a
child per command a launcher (:mod:`tests.warm_python_client`) sends, and the child becomes
that command's process (:mod:`tests.warm_python_child`). Started and stopped by :mod:`tests.warm_python`, one per
xdist worker, as ``python -m tests.warm_python_server SOCKET LAUNCHER``.

What it refuses, so the launcher runs the command cold on the real interpreter: a
``PYTHONPATH`` other than its own (but for the zips and jars of the very pyspark it imports,
which Spark's daemons put first), a ``PYTHONHASHSEED`` other than 0 (the server's: every child
hashes strings as seed 0 does), and any other environment variable read at import time that
differs from its own (:func:`refusal`).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
from pathlib import Path

PRELOAD = (
    "tensorflow",
    "keras",
    "mlflow",
    "mlflow.pyfunc",
    "mlflow.store.tracking.sqlalchemy_store",  # SQLAlchemy and Alembic: every CLI run's store
    "mlflow.store.model_registry.sqlalchemy_store",
    "pyarrow.parquet",
    "pyarrow.dataset",
    "pandas",
    "deltalake",
    "keras_dl.cli",
    "keras_dl.train",
    "keras_dl.launch.rank",
    "keras_dl.data.training_rows",
)
# Read when a package is imported (the server's value is in the child), not when used.
AT_IMPORT = (
    "PYTHON",
    "TF_",
    "KERAS_BACKEND",
    "KERAS_HOME",
    "CUDA",
    "LD_",
    "OMP_",
    "OPENBLAS",
    "MKL_",
    "MALLOC",
    "HOME",
    "KERAS_DL_DEFER_KERAS_EXTRAS",  # keras_dl_keras_hook, registered at interpreter start
)
# Set in the child (tests/warm_python_child.py) or read when used, not at import.
LAZY = {
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "TF_CONFIG",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
}
# The children hash strings as the server does: tests/warm_python.py starts it with seed 0, what
# Spark gives its Python workers (their partitions of strings must agree); a child asking for no
# seed gets one fixed draw, as every child of one server shared one before.
HASH_SEEDS = (None, "0")
_PYSPARK = importlib.util.find_spec("pyspark")
PYSPARK = os.path.realpath(_PYSPARK.submodule_search_locations[0]) if _PYSPARK else None


def _import_env(env: dict) -> dict:
    """The variables read at import time. CPython's own have no underscore after ``PYTHON``
    (``PYTHON_WORKER_FACTORY_SECRET`` and ``PYTHON_UDF_BATCH_SIZE`` are Spark's, read when used);
    ``PYTHONPATH`` and ``PYTHONHASHSEED`` are :func:`refusal`'s own checks."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(AT_IMPORT)
        and not k.startswith("PYTHON_")
        and k not in LAZY
        and k not in ("PYTHONPATH", "PYTHONHASHSEED")
    }


def _pythonpath(env: dict) -> list:
    """Its folders in order, each once (a repeated entry changes nothing ``sys.path`` finds)."""
    return list(dict.fromkeys(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p))


def _pyspark_own(entry: str) -> bool:
    """Whether ``entry`` lies inside the pyspark package the server imports: Spark's daemons
    and workers start with its ``python/lib/pyspark.zip``, py4j's zip and a jar first on their
    path, the same code the server imported from the package itself."""
    real = os.path.realpath(entry)
    return PYSPARK is not None and os.path.commonpath([real, PYSPARK]) == PYSPARK


def refusal(env: dict) -> str | None:
    """Why a command with this environment must run cold, or None."""
    path, mine_path = _pythonpath(env), _pythonpath(os.environ)
    if path != mine_path and not all(p in mine_path or _pyspark_own(p) for p in path):
        return f"PYTHONPATH {env.get('PYTHONPATH', '')!r}"
    if env.get("PYTHONHASHSEED") not in HASH_SEEDS:
        return f"PYTHONHASHSEED {env['PYTHONHASHSEED']!r}"
    mine, theirs = _import_env(os.environ), _import_env(env)
    if mine != theirs:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        return "import-time variables differ: " + ", ".join(diff)
    return None


class Job:
    def __init__(self, request: dict, fds: list, launcher: str):
        self.args, self.env, self.cwd = request["args"], request["env"], request["cwd"]
        self.umask, self.limits = request["umask"], request["limits"]
        self.fds, self.launcher = fds, launcher
        self.client = request["client"]
        # The child's sys.path: the command's PYTHONPATH in place of the server's.
        self.pythonpath, self.server_pythonpath = _pythonpath(self.env), _pythonpath(os.environ)


def _reply(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(text.encode() + b"\n")
    except OSError:
        pass


def serve(path: str, launcher: str) -> Job:
    """Import, then fork a child per request; returns only in a child, with its command."""
    for name in PRELOAD:
        __import__(name)
    # The children's new SQLite MLflow stores start migrated, as the tests' own do: a CLI run's
    # first MLflow call ran all of MLflow's migrations (about 1 CPU-s, 13-29 s at load 20).
    from tests import mlflow_template

    mlflow_template.install(mlflow_template.build(Path(path).parent / "mlflow-template"))
    # What is imported now is shared by every child; frozen, the children's collections do not
    # walk it (a walk writes to each object's header: a copy-on-write fault per page it touches).
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(128)
    os.rename(path + ".tmp", path)  # connectable once it exists
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(0, selectors.EVENT_READ, "stdin")  # the xdist worker's pipe: EOF when it ends
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in sel.select():
            if key.data == "stdin":
                if not os.read(0, 4096):
                    for pid in children:
                        _kill(pid)
                    os._exit(0)
            elif key.data == "child":
                os.read(wake_r, 4096)
                _reap(children, sel)
            elif key.data == "accept":
                conn, _ = listener.accept()
                job = _request(conn, launcher)
                if job is None:
                    conn.close()
                    continue
                if isinstance(job, str):
                    _reply(conn, f"cold {job}")
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    for fd in (listener.fileno(), wake_r, wake_w, conn.fileno()):
                        os.close(fd)
                    for other in children.values():
                        other.close()
                    return job
                for fd in job.fds:
                    os.close(fd)
                Path(os.path.dirname(path), f"pid.{job.client}").write_text(str(pid))
                _reply(conn, f"pid {pid}")
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # the client's end closed before its child ended: it died, so does the child,
                # before any other command starts (a rerun must find it gone, its locks free)
                sel.unregister(key.fileobj)
                _kill(key.data)
                try:
                    os.waitpid(key.data, 0)
                except ChildProcessError:
                    pass
                children.pop(key.data, None)
                key.fileobj.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(children: dict, sel: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):
            _reply(conn, f"signal {os.WTERMSIG(status)}")
        else:
            _reply(conn, f"exit {os.waitstatus_to_exitcode(status)}")
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


def _request(conn: socket.socket, launcher: str):
    conn.settimeout(30)
    try:
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        if len(head) < 4 or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return None
        (size,) = struct.unpack("!I", head)
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise OSError("short request")
            data += chunk
        request = json.loads(data)
    except (OSError, ValueError):
        return None
    conn.settimeout(None)
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    request["client"] = struct.unpack("3i", creds)[0]
    why = refusal(request["env"])
    if why is not None:
        for fd in fds:
            os.close(fd)
        print(f"warm python: cold: {request['args'][:3]}: {why}", file=sys.stderr, flush=True)
        return why
    return Job(request, fds, launcher)


def _main() -> None:
    job = serve(sys.argv[1], sys.argv[2])
    from tests import warm_python_child  # in the child only: the server never runs a command

    warm_python_child.main(job)


if __name__ == "__main__":
    _main()
