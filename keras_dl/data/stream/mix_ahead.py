"""A mixed stream's next epoch planned on a thread while this epoch streams.

Planning a shard's epoch of a mixed split (:meth:`keras_dl.data.stream.mix.MixRows.rank`: the
source of every slot, then a seeded permutation per shuffle pool) takes tens of milliseconds a
million rows, and the epoch's first chunk waited for it. The plan is a pure function of the
epoch and its layout, so the next one is computed ahead; it is used only when it was asked for
the same epoch and layout, and computed again otherwise (a resume changed the layout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class PlanAhead:
    """``plan(epoch, layout)``, the next epoch's started on a thread as each one is taken.

    Args:
        plan: The plan of one epoch under a layout (pure: the same arguments, the same plan).
        layout_of: The layout an epoch will be asked under.
        same: Whether two layouts plan the same rows.
    """

    def __init__(
        self,
        plan: Callable[[int, Any], Any],
        layout_of: Callable[[int], Any],
        same: Callable[[Any, Any], bool],
    ):
        self._plan, self._layout_of, self._same = plan, layout_of, same
        self._pending: tuple | None = None  # (epoch, layout, thread, {"plan" or "error"})

    def take(self, epoch: int, layout) -> Any:
        """``epoch``'s plan under ``layout``; then start planning the epoch after it."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == epoch and self._same(pending[1], layout):
            pending[2].join()
            if "error" in pending[3]:
                raise pending[3]["error"]
            result = pending[3]["plan"]
        else:
            result = self._plan(epoch, layout)
        self._start(epoch + 1)
        return result

    def _start(self, epoch: int) -> None:
        layout, out = self._layout_of(epoch), {}

        def run():
            try:
                out["plan"] = self._plan(epoch, layout)
            except BaseException as exc:  # raised where the plan is taken, as if computed there
                out["error"] = exc

        thread = threading.Thread(target=run, name="keras_dl-mix-plan", daemon=True)
        thread.start()
        self._pending = (epoch, layout, thread, out)
