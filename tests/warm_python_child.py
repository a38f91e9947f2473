"""A warm interpreter's child becoming the command it was forked for, and ending as it would.

:mod:`tests.warm_python_server` forks a child per command; in the child, :func:`main` puts the
caller's streams, working directory, umask, limits and environment in place, runs the command
as ``python -m``/``-c``/``SCRIPT`` would (``runpy``), and ends the process: non-daemon threads
joined, ``atexit`` run, streams flushed, the status of ``SystemExit`` or of an uncaught
exception (whose traceback starts at the command's frame), then ``os._exit`` (:func:`finish`).
"""

from __future__ import annotations

import atexit
import os
import resource
import runpy
import signal
import sys
import threading
import traceback
import types


def run(job) -> None:
    """In the child: become the command's process, as ``python ARGS`` would start it."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(job.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(job.cwd)
    os.umask(job.umask)
    for name, (soft, hard) in job.limits.items():
        if resource.getrlimit(getattr(resource, name)) != (soft, hard):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    os.environ.clear()
    os.environ.update(job.env)
    if job.pythonpath != job.server_pythonpath:  # where a fresh interpreter puts PYTHONPATH
        rest = [p for p in sys.path[1:] if p not in job.server_pythonpath]
        sys.path[1:] = [*job.pythonpath, *rest]
    sys.dont_write_bytecode = bool(job.env.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(job.env.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=unbuffered or os.isatty(1), write_through=unbuffered)
    sys.executable = job.launcher
    if "numpy" in sys.modules:  # a fresh process seeds its global generator from the OS
        sys.modules["numpy"].random.seed()
    run_command(job.args)


def run_command(args: list) -> None:
    """Run ``args`` in this process as ``python ARGS`` runs them: ``-m MODULE``, ``-c CODE`` or
    ``SCRIPT``, with their ``sys.argv`` and ``sys.path[0]``."""
    flag, rest = args[0], args[1:]
    if flag == "-m":
        sys.argv = ["-m", *rest[1:]]
        sys.path[0] = os.getcwd()
        sys.modules.pop(rest[0], None)  # `-m X` runs X as __main__, apart from an import of X
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    elif flag == "-c":
        sys.argv = ["-c", *rest[1:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(rest[0], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(flag))
        runpy.run_path(flag, run_name="__main__")


def _exit_code(exc: SystemExit) -> int:
    """What a fresh interpreter exits with for ``SystemExit(code)``, printing a message code."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def finish(code: int) -> None:
    """End the child as an interpreter ends, up to the teardown of its modules: wait for the
    non-daemon threads, run ``atexit`` (MLflow ends its run there, ``weakref.finalize`` cleans
    up), flush the standard streams; then ``os._exit``, as multiprocessing's forked children do.
    Tearing down the modules would write to every object the server imported (copy-on-write:
    2.5-4.5 CPU-s a command on a slow day, measured with ``python -c pass``); what only that
    teardown does (``__del__`` of objects still referenced from modules) is left undone, and the
    tests of an interpreter's exit itself run on :data:`tests.warm_python.REAL_PYTHON`."""
    try:
        threading._shutdown()
    except BaseException:  # noqa: BLE001 - as at exit: reported, then the exit goes on
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # a fresh interpreter's status when flushing stdout fails
    os._exit(code & 0xFF)


def main(job) -> None:
    """Run ``job`` (a :class:`tests.warm_python_server.Job`) and end this process with its status."""
    try:
        run(job)
    except SystemExit as exc:
        finish(_exit_code(exc))
    except KeyboardInterrupt:
        raise  # a fresh interpreter ends by the SIGINT itself: the usual exit does that
    except BaseException as exc:  # printed as a fresh interpreter would: from the command's frame
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OURS:
            tb = tb.tb_next
        tb = tb or exc.__traceback__
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        finish(1)
    finish(0)


_OURS = (__file__, runpy.__file__)
