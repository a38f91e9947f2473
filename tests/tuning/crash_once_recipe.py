"""digits, but the first attempt of Spark task 0 loses its Python worker (``os._exit``, as a
crash or an OOM kill would) while building its second trial's model: what
``test_task_retry`` has Spark retry. The marker file (``KERAS_DL_TEST_CRASH_MARKER``) says it
happened, and which trial number the dead attempt was on is read from the study."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

from recipes.digits import RECIPE as DIGITS

MARKER = "KERAS_DL_TEST_CRASH_MARKER"
_built: Counter = Counter()  # models built per (task, attempt) in this Python worker


def build_model(data, exp):
    from pyspark import TaskContext

    task = TaskContext.get()
    if task is not None:
        key = (task.partitionId(), task.attemptNumber())
        _built[key] += 1
        if key == (0, 0) and _built[key] == 2:
            with open(os.environ[MARKER], "w") as f:
                f.write(f"{os.getpid()}\n")
            os._exit(1)
    return DIGITS.build_model(data, exp)


RECIPE = dataclasses.replace(DIGITS, name="tests.tuning.crash_once_recipe", build_model=build_model)
