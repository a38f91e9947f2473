"""A rank (or worker) that prints a line, then waits for the test to say go: it ends only after
the launcher's caller has seen that line, so a line seen at all came while the job ran."""

from __future__ import annotations

MARKER = "printed before the rank waits"


def print_then_wait(folder: str) -> bool:
    """Print :data:`MARKER`, then wait (2 minutes at most) for ``folder/go``; True if it came."""
    import os
    import time

    print(MARKER, flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
        time.sleep(0.2)
    return os.path.exists(os.path.join(folder, "go"))
