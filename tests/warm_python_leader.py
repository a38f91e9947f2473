"""A command that leads its own process group, run cold with warm descendants.

The launcher (:mod:`tests.warm_python_client`) runs such a command on the real interpreter:
a signal sent to its group, ``SIGSTOP`` and ``SIGKILL`` included, must reach the command
itself, which a child of the server (in the server's group) would not get. Its Python
subprocesses need no such thing: they are ordinary commands, as a warm driver's ranks are. So
the launcher runs ``REAL_PYTHON warm_python_leader.py LAUNCHER ARGS...``: this sets
``sys.executable`` to the launcher and runs ARGS as ``python ARGS`` would
(:func:`tests.warm_python_child.run_command`), and the ranks, workers and scripts the command
starts with ``sys.executable`` fork from the warm server. The kill tests' drivers, whose
Horovod ranks ran cold with them before (26 ranks, 235 CPU-s in a whole run), are such commands.
"""

import sys


def main() -> None:
    launcher, *args = sys.argv[1:]
    sys.executable = launcher
    from warm_python_child import run_command  # this file's folder is sys.path[0] until then

    run_command(args)


if __name__ == "__main__":
    main()
