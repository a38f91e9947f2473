"""The next epoch's mixed plan, made on a thread, is the plan asked for or is not used."""

from __future__ import annotations

import threading

import pytest

from keras_dl.data.stream.mix_ahead import PlanAhead


def test_the_next_epoch_is_planned_ahead_and_used_only_for_its_own_layout():
    calls = []

    def plan(epoch, layout):
        calls.append((epoch, layout, threading.current_thread().name))
        if layout == "bad":
            raise ValueError(f"no plan for epoch {epoch}")
        return (epoch, layout)

    layouts = {}
    ahead = PlanAhead(plan, lambda e: layouts.get(e, "whole"), lambda a, b: a == b)
    here = threading.current_thread().name
    assert ahead.take(0, "whole") == (0, "whole")  # planned here, and epoch 1 started
    assert ahead.take(1, "whole") == (1, "whole")  # planned ahead (its thread was joined)
    assert (0, "whole", here) in calls and (1, "whole", "keras_dl-mix-plan") in calls
    # Asked under another layout (a resume): planned again here, the one ahead not used.
    assert ahead.take(2, "resumed") == (2, "resumed")
    assert (2, "resumed", here) in calls
    # An error planning ahead is raised where that plan is taken.
    layouts[4] = "bad"
    ahead.take(3, "whole")
    with pytest.raises(ValueError, match="no plan for epoch 4"):
        ahead.take(4, "bad")
