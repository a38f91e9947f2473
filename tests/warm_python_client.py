"""The ``python`` the suite's subprocesses run: a process forked from a warm interpreter.

A test that starts ``python -m keras_dl.cli ...``, and every Horovod rank, Spark daemon and
scaling worker those start, runs this file first (through the launcher :mod:`tests.warm_python`
writes, with ``-S``: standard library only, about 20 ms). It sends its arguments, environment,
working directory and standard streams to the xdist worker's server, which forks a child that
already imported TensorFlow, Keras and MLflow; the child runs the command as a fresh
interpreter would. This process stands in for it: signals sent to it are passed on, it exits
with the child's status (or by the child's signal), and if it dies the server kills the child.

Anything it cannot run that way exactly runs on the real interpreter instead (``os.execv``; the
reason goes to the server's log, which ``$KERAS_DL_WARM_PYTHON_LOG`` keeps):
interpreter options (``-u``, ``-B``, ``-X ...``), no command, a process that leads its own
process group (a signal to the group must reach the command itself; its Python subprocesses
are still served, :mod:`tests.warm_python_leader`), a closed
standard stream, ``KERAS_DL_COLD_PYTHON`` set (a bench counts its descendants' CPU), a server
that is not there, and what the server refuses (a different
``PYTHONPATH`` or an environment variable read at import, :mod:`tests.warm_python_server`).
"""

import json
import os
import resource
import signal
import socket
import struct
import sys

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)

LIMITS = ("RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA")


def warmable(args: list) -> bool:
    """``-m MODULE ...``, ``-c CODE ...`` or ``SCRIPT ...``: no interpreter option."""
    if not args:
        return False
    if args[0] in ("-m", "-c"):
        return len(args) >= 2
    return not args[0].startswith("-")


def cold(real: str, args: list, server: str = "", why: str = "", run: list | None = None) -> None:
    """Run on the real interpreter, in this process (``run``: what it runs instead of ``args``);
    what the client decided here (the server logs its own refusals) goes to the server's log."""
    if why:
        try:
            log = os.open(
                os.path.join(os.path.dirname(server), "server.log"), os.O_WRONLY | os.O_APPEND
            )
            os.write(log, f"warm python: cold: {args[:3]}: {why}\n".encode())
            os.close(log)
        except OSError:
            pass
    os.execv(real, [real, *(args if run is None else run)])


def main(server: str, real: str) -> None:
    args = sys.argv[1:]
    if not warmable(args):
        cold(real, args, server, "interpreter options or no command")
    if os.getpgrp() == os.getpid():  # cold itself, with warm descendants
        launcher = os.path.join(os.path.dirname(server), "python")
        leader = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_python_leader.py")
        cold(real, args, server, "leads its process group", run=[leader, launcher, *args])
    if os.environ.get("KERAS_DL_COLD_PYTHON"):
        cold(real, args, server, "KERAS_DL_COLD_PYTHON")
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        cold(real, args, server, "a standard stream is closed")
    child = [0]
    pending = []

    def forward(signum, frame):
        if child[0]:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(server)
    except OSError:
        cold(real, args, server, "no server")
    umask = os.umask(0o022)
    os.umask(umask)
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS}
    request = {"args": args, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask}
    request = json.dumps({**request, "limits": limits}).encode()
    try:
        socket.send_fds(conn, [struct.pack("!I", len(request))], [0, 1, 2])
        conn.sendall(request)
    except OSError:
        cold(real, args, server, "the server did not take the request")
    replies = conn.makefile("r")
    first = replies.readline().split()
    if first[:1] == ["cold"]:  # refused: the server logged why
        conn.close()
        cold(real, args)
    if first[:1] != ["pid"]:
        conn.close()
        cold(real, args, server, "the server went away before replying")
    child[0] = int(first[1])
    for signum in pending:
        os.kill(child[0], signum)
    last = replies.readline().split()
    if len(last) == 2 and last[0] == "exit":
        os._exit(int(last[1]))
    if len(last) == 2 and last[0] == "signal":
        signum = int(last[1])
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    sys.stderr.write(f"warm python: the server at {server} went away while child {child[0]} ran\n")
    os._exit(70)
