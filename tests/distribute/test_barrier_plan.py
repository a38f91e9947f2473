"""The barrier launcher's rank layout (keras_dl.launch.barrier) is Horovod's own."""

from __future__ import annotations

import pytest

from keras_dl.launch.barrier import _slot_plan


@pytest.mark.parametrize("hosts", ["a:1", "a:2", "a:2,b:2", "a:3,b:1", "a:1,b:2,c:2"])
def test_slot_plan_matches_horovods_host_assignments(hosts):
    """Tasks grouped by host (how Spark lists them per executor): every rank gets the local and
    cross rank and sizes horovod.runner's own launcher would give it."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    parsed = parse_hosts(hosts)
    expected = get_host_assignments(parsed, sum(h.slots for h in parsed))
    task_hosts = [h.hostname for h in parsed for _ in range(h.slots)]
    assert _slot_plan(task_hosts) == expected


def test_slot_plan_of_interleaved_tasks_keeps_the_task_order_as_ranks():
    """Spark may list one host's tasks apart: ranks stay the tasks' partition ids."""
    plan = _slot_plan(["b", "a", "b"])
    assert [s.rank for s in plan] == [0, 1, 2]
    assert [(s.local_rank, s.local_size) for s in plan] == [(0, 2), (0, 1), (1, 2)]
    assert [(s.cross_rank, s.cross_size) for s in plan] == [(0, 2), (1, 2), (0, 1)]


def test_a_spark_task_loads_the_barrier_module_without_tensorflow():
    """A barrier task unpickles its function from keras_dl.launch.barrier and starts its rank's
    process, which loads TensorFlow itself: the task must not load it too (5 CPU-seconds and
    700 MB per task)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = (
        "import sys, keras_dl.launch.barrier\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout[-2000:]
