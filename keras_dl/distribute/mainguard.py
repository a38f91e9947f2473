"""Refuse to launch Horovod processes from an unguarded script, with the fix.

Horovod's local launcher starts helper processes with multiprocessing's "spawn", which
re-imports the main script in each of them. A script that calls ``HorovodRunner.run`` at its
top level, outside ``if __name__ == "__main__":``, would then launch again inside those
processes, and multiprocessing stops that with a long "bootstrapping phase" traceback. This
module finds the call site before anything starts and says what to change.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from keras_dl.errors import DistributedError


def check_main_guard(what: str = "HorovodRunner.run") -> None:
    """Raise when the running ``__main__`` script reaches this call outside a main guard.

    Notebooks, ``python -c`` and ``python -m`` of a module that is not ``__main__`` pass:
    only a script file run as ``__main__`` is re-imported by the spawned processes.

    Raises:
        DistributedError: Naming the script and line and showing the guard to add.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not Path(path).is_file():
        return
    frame = sys._getframe(1)
    while frame is not None:  # the outermost frame that runs the script's own top level
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            break
        frame = frame.f_back
    if frame is None or _guarded(Path(path), frame.f_lineno):
        return
    raise DistributedError(
        f"{what} is called at the top level of {path} (line {frame.f_lineno}), outside "
        '`if __name__ == "__main__":`. Horovod\'s local launcher re-imports the script in the '
        "processes it starts, which would launch the job again from each of them. Move the "
        'call under that guard:\n\n    if __name__ == "__main__":\n        '
        "HorovodRunner(np=-2).run(main)"
    )


def _guarded(path: Path, line: int) -> bool:
    """True when ``line`` of ``path`` sits inside a top-level ``if __name__ == "__main__":``."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return True  # cannot tell: do not stand in the way
    for node in tree.body:
        if not (node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        return isinstance(node, ast.If) and _is_main_test(node.test)
    return True


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.comparators) == 1):
        return False
    names = {
        ast.unparse(test.left).strip(),
        ast.unparse(test.comparators[0]).strip(),
    }
    return "__name__" in names and bool(names & {"'__main__'", '"__main__"'})
