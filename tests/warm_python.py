"""A warm interpreter the suite's Python subprocesses fork from, instead of each importing
TensorFlow, Keras and MLflow anew (about 5 CPU-s a process, some 500 processes a run).

Process accounting of a whole run (``tests/process_accounting.py``) showed the suite spends
half its CPU in Python processes the tests start: CLI runs, Horovod ranks, Spark's Python
daemons, scaling workers, barrier ranks. Most of that is their imports. So each xdist worker
starts one server (:func:`start`) that imports them once and then forks a child per command;
``sys.executable`` in the worker, and in every child, is a launcher that runs
:mod:`tests.warm_python_client`, so a command started the usual way (``[sys.executable, "-m",
...]``, Horovod's ``executable``, ``PYSPARK_PYTHON``) runs in such a child. The child is a real
process running the real command: its own PID, the caller's standard streams, environment and
working directory, its exit status or signal passed back, interpreter shutdown (``atexit``,
MLflow ending its run) as usual. Only the imports it shares were done before it started.

Refused (run cold, on the real interpreter, as a fresh process): interpreter options, a
process that leads its own group, a ``PYTHONPATH`` other than the server's, and any environment
variable read at import time (``PYTHON*``, ``TF_*``, ``KERAS_BACKEND``, ``KERAS_HOME``, ``CUDA*``, ``LD_*``, thread
counts, ``HOME``) that differs from the server's. Tests of a fresh interpreter itself use
:data:`REAL_PYTHON`. ``KERAS_DL_COLD_PYTHON=1`` turns the server off for a run.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import struct
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
PRELOAD = (
    "tensorflow",
    "keras",
    "mlflow",
    "mlflow.pyfunc",
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
)
LAZY = {"PYTHONUNBUFFERED", "TF_CONFIG", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"}


def _import_env(env: dict) -> dict:
    return {
        k: v
        for k, v in env.items()
        if k.startswith(AT_IMPORT) and k not in LAZY and k != "PYTHONPATH"
    }


def _pythonpath(env: dict) -> list:
    """Its folders in order, each once (a repeated entry changes nothing ``sys.path`` finds)."""
    return list(dict.fromkeys(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p))


def refusal(env: dict) -> str | None:
    """Why a command with this environment must run cold, or None."""
    if _pythonpath(env) != _pythonpath(os.environ):
        return f"PYTHONPATH {env.get('PYTHONPATH', '')!r}"
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


def _reply(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(text.encode() + b"\n")
    except OSError:
        pass


def serve(path: str, launcher: str) -> Job:
    """Import, then fork a child per request; returns only in a child, with its command."""
    for name in PRELOAD:
        __import__(name)
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


def run(job: Job) -> None:
    """In the child: become the command's process, as ``python ARGS`` would start it."""
    import runpy
    import types

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(job.fds):
        os.dup2(fd, target)
        os.close(fd)
    import resource

    os.chdir(job.cwd)
    os.umask(job.umask)
    for name, (soft, hard) in job.limits.items():
        if resource.getrlimit(getattr(resource, name)) != (soft, hard):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    os.environ.clear()
    os.environ.update(job.env)
    unbuffered = bool(job.env.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=unbuffered or os.isatty(1), write_through=unbuffered)
    sys.executable = job.launcher
    if "numpy" in sys.modules:  # a fresh process seeds its global generator from the OS
        sys.modules["numpy"].random.seed()
    flag, rest = job.args[0], job.args[1:]
    if flag == "-m":
        sys.argv = ["-m", *rest[1:]]
        sys.path[0] = os.getcwd()
        sys.modules.pop(
            rest[0], None
        )  # `python -m X` runs X as __main__, apart from an import of X
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    elif flag == "-c":
        sys.argv = ["-c", *rest[1:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(rest[0], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(job.args)
        sys.path[0] = os.path.dirname(os.path.realpath(flag))
        runpy.run_path(flag, run_name="__main__")


def start() -> subprocess.Popen | None:
    """This process's server, and ``sys.executable`` pointed at its launcher."""
    if os.environ.get("KERAS_DL_COLD_PYTHON"):
        return None
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
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO)}
    with open(f"{folder}/server.log", "w") as log:
        server = subprocess.Popen(
            [REAL_PYTHON, "-m", "tests.warm_python", path, launcher],
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


def _main() -> None:
    job = serve(sys.argv[1], sys.argv[2])
    try:
        run(job)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # printed as a fresh interpreter would: from the command's frame
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, _RUNPY):
            tb = tb.tb_next
        tb = tb or exc.__traceback__
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)


_RUNPY = __import__("runpy").__file__

if __name__ == "__main__":
    _main()
