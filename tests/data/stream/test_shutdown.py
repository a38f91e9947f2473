"""A script that leaves a dataset behind still exits, and a dropped iterator stops its readers.

Each case runs a script in a fresh interpreter over a tiny Delta table. Before
:mod:`keras_dl.data.stream.shutdown`, a script that ended mid-epoch hung at exit (TensorFlow's
prefetch thread, ended by the interpreter's finalization inside the generator's ``py_func``,
was waited for forever) or aborted. The timeout below is a hang detector, not a timing.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import REPO, write_test_table
from tests.warm_python import REAL_PYTHON

HANG_SECONDS = 120  # a script that has not exited by then is hung (they take ~15 s here)

PRELUDE = """
import gc, json, sys, threading
from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns

def reader_threads():  # Python threads keras_dl or Petastorm started (TF's show as Dummy-N)
    return sorted(
        t.name for t in threading.enumerate()
        if t.ident not in before and not isinstance(t, threading._DummyThread)
    )

before = {t.ident for t in threading.enumerate()}
snapshot = open_table(sys.argv[1])
split = make_dataset(
    snapshot, plan_columns(snapshot), ReadOptions(batch_size=int(sys.argv[2]), training=True)
)
"""

LEFT_BEHIND = (
    PRELUDE
    + """
it = iter(split.dataset)
for _ in range(int(sys.argv[3])):
    next(it)
print(json.dumps({"running": reader_threads()}), flush=True)
"""
)

DROPPED = (
    PRELUDE
    + """
it = iter(split.dataset)
next(it)
next(it)
running = reader_threads()
del it
gc.collect()
print(json.dumps({"running": running, "after": reader_threads()}), flush=True)
"""
)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    """20,000 rows in 200 row groups of 100, over 4 files."""
    path = str(tmp_path_factory.mktemp("exit") / "t")
    n = 20_000
    data = pa.table(
        {"x": np.arange(n, dtype=np.float32), "label": (np.arange(n) % 2).astype(np.int64)}
    )
    return write_test_table(path, data, rows_per_group=100, rows_per_file=5000)


def _run(script: str, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        proc = subprocess.run(
            [REAL_PYTHON, "-c", script, *map(str, args)],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script did not exit within {HANG_SECONDS} s: {exc.stdout!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_script_that_leaves_an_iterator_mid_epoch_exits(table):
    out = _run(LEFT_BEHIND, table, 8, 2)  # 2 of 2,500 batches: the epoch's reader is running
    assert any("_ventilate" in name for name in out["running"]), out


@pytest.mark.slow
def test_a_dropped_iterator_stops_its_readers_threads(table):
    out = _run(DROPPED, table, 8)
    assert any("_ventilate" in name for name in out["running"]), out
    assert out["after"] == [], out


@pytest.mark.slow
def test_a_script_that_leaves_training_epochs_read_ahead_exits(table):
    # 20,000 rows at batch 5,000: 4 steps an epoch, so tf.data's buffers hold epochs read ahead
    # and the next epoch's reader opens on its own thread while the script ends.
    _run(LEFT_BEHIND, table, 5000, 9)
