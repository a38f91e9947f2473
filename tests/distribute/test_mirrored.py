"""MirroredStrategy on 2 logical CPU devices trains like one device with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, seed_store

# Logical devices must be configured before TensorFlow initializes, hence a fresh interpreter.
SCRIPT = """
import json, sys
from keras_dl.distribute.strategy import use_logical_cpus
use_logical_cpus(2)
from keras_dl.config import resolve
from keras_dl.recipe import load_recipe
from keras_dl.train import fit

table, tmp = sys.argv[1], sys.argv[2]
# Whole global batches only (19 x 64 train rows): a last partial batch is split between the
# replicas by tf.distribute, which averages the two halves' means (one device takes the mean
# of the whole batch), so only whole batches train identically; the partial batch has its
# own test below.
import pyarrow as pa, pyarrow.compute as pc
from keras_dl.data import read_table
from tests.conftest import write_test_table
rows = read_table(table)
train = rows.filter(pc.equal(rows["split"], "train")).slice(0, 19 * 64)
table = write_test_table(f"{tmp}/whole", pa.concat_tables([train, rows.filter(pc.equal(rows["split"], "test"))]), 128)
out = {}
for strategy in ("none", "mirrored"):
    exp = resolve(load_recipe("digits").defaults, sets=[
        f"data.table={table}", "data.validation_split=", "data.workers=1",
        # No per-replica randomness or batch statistics: BatchNorm over 32 rows per replica and
        # a random shift per replica would differ from one device by design, not by a bug.
        "model.dropout=0.0", "model.batch_norm=false", "model.shift=0.0", "train.epochs=3", "train.verbose=0", "train.batch_size=64",
        # Plain SGD: Adam divides by the root of tiny second moments, which turns float
        # summation-order differences (one device vs two replicas) into 1e-4 drift by epoch 3.
        "train.optimizer=sgd", "train.learning_rate=0.5",
        f"runtime.strategy={strategy}", f"runtime.run_dir={tmp}/{strategy}",
        f"tracking.uri=sqlite:///{tmp}/{strategy}.db", "tracking.log_model=false",
    ])
    result = fit(exp)
    replicas = result.model.distribute_strategy.num_replicas_in_sync
    out[strategy] = {"loss": result.history["loss"], "replicas": replicas,
                     "test_accuracy": result.metrics["test_accuracy"]}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_two_logical_devices_match_one_device(digits_table, tmp_path):
    out = _run(SCRIPT, digits_table, tmp_path)
    assert out["none"]["replicas"] == 1 and out["mirrored"]["replicas"] == 2
    one, two = out["none"]["loss"], out["mirrored"]["loss"]
    # Same data order, same global batch of 64 (32 per replica), averaged gradients: the losses
    # differ only by float summation order (measured: about 1e-7 relative after 3 epochs).
    assert two == pytest.approx(one, rel=1e-5)
    assert one[-1] < one[0] * 0.8  # and it trained


ONE_GROUP = """
import dataclasses, json, sys
from keras_dl.distribute.strategy import use_logical_cpus
use_logical_cpus(2)
from keras_dl.config import resolve
from keras_dl.data import read_table
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import write_test_table
from tests.distribute.workers import RowsSeen

table, tmp = sys.argv[1], sys.argv[2]
rows = read_table(table)
one = write_test_table(f"{tmp}/one", rows, rows_per_group=rows.num_rows)  # one row group
recipe = load_recipe("digits")
recipe = dataclasses.replace(recipe, metrics=(*recipe.metrics, RowsSeen()))
exp = resolve(recipe.defaults, sets=[
    f"data.table={one}", "data.validation_split=", "data.workers=1", "train.epochs=2",
    "train.verbose=0", "train.batch_size=64", "runtime.strategy=mirrored",
    f"runtime.run_dir={tmp}/run", f"tracking.uri=sqlite:///{tmp}/m.db", "tracking.log_model=false",
])
result = fit(exp, recipe=recipe)
print("RESULT " + json.dumps({"rows": result.history["rows_seen"],
      "replicas": result.model.distribute_strategy.num_replicas_in_sync}))
"""


@pytest.mark.slow
def test_two_replicas_train_every_row_of_a_one_row_group_table(digits_table, tmp_path):
    out = _run(ONE_GROUP, digits_table, tmp_path)
    # 1257 train rows: 19 batches of 64 and a last one of 41, split over the two replicas.
    assert out["replicas"] == 2 and out["rows"] == [1257.0, 1257.0]


def _run(script: str, table: str, tmp_path) -> dict:
    """Run ``script`` in a fresh interpreter (logical devices must be set before TF starts)."""
    for store in ("none.db", "mirrored.db", "m.db"):  # the scripts' tracking stores
        seed_store(tmp_path / store)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", script, table, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])
