"""A failing or killed rank fails the whole job fast; bad setups fail with a clear message."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import mlflow
import pytest

from keras_dl.errors import DataError, DistributedError
from keras_dl.launch import launch
from tests.conftest import HEAVY, REPO, runs_in
from tests.distribute.conftest import digits_experiment
from tests.distribute.workers import train_with_fault

pytestmark = HEAVY  # see tests/conftest.py


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("raise", r"rank 1 failed: RuntimeError: injected fault on rank 1"),
        # Horovod names the killed rank (exit -9), or, when a rank stopped by the shutdown
        # exited first, the rank that left no report.
        ("kill", r"rank 1 died(: killed by signal 9 \(SIGKILL\)| without an error of its own)"),
    ],
)
def test_a_failing_rank_fails_the_job_within_60s(digits_exp, tmp_path, mode, message):
    exp = digits_exp("runtime.strategy=horovod", "runtime.np=-2", "train.epochs=3")
    stamp = tmp_path / "fault_time"
    main = functools.partial(
        train_with_fault, mode=mode, rank=1, epoch=1, batch=2, stamp=str(stamp)
    )
    with pytest.raises(DistributedError, match=message):
        launch(exp, main=main)
    assert stamp.exists(), "the fault was never injected"
    elapsed = time.time() - float(stamp.read_text())
    print(f"job failed {elapsed:.1f} s after the fault ({mode})")
    assert elapsed < 60
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FAILED"

    if mode == "kill":
        # A later launch resumes from the checkpoint of epoch 0, in the same MLflow run.
        result = launch(exp)
        (resumed,) = runs_in(exp.tracking.uri)
        assert resumed.info.run_id == run.info.run_id == result.run_id
        assert resumed.info.status == "FINISHED"
        client = mlflow.MlflowClient(exp.tracking.uri)
        steps = [m.step for m in client.get_metric_history(result.run_id, "loss")]
        assert steps == list(range(exp.train.epochs))
        assert len(result.history["loss"]) == exp.train.epochs - 1  # epochs 1 and 2 only


@pytest.mark.slow
def test_more_ranks_than_rows_is_a_clear_error(tmp_path):
    import pyarrow as pa

    from tests.conftest import write_test_table

    table = str(tmp_path / "one_row")  # one training row for two ranks
    rows = pa.table({"pixels": [[0.0] * 64], "label": [1], "split": ["train"]})
    write_test_table(table, rows, rows_per_group=1)
    exp = digits_experiment(table, tmp_path, "runtime.strategy=horovod", "runtime.np=-2")
    # A rank's own DataError reaches the caller as that DataError (its class and exit code).
    with pytest.raises(
        DataError, match=r"rank \d failed: DataError: .*1 live row\(s\) but 2 shards"
    ):
        launch(exp)
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FAILED"


@pytest.mark.slow
@pytest.mark.parametrize("np_", ["-2", "0"])
def test_horovod_that_does_not_import_is_a_clear_error(digits_table, tmp_path, np_):
    # A real interpreter in which `import horovod` fails, as on a machine without the build.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoHorovod:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'horovod' or name.startswith('horovod.'):\n"
        "            raise ImportError('No module named horovod (blocked by the test)')\n"
        "sys.meta_path.insert(0, NoHorovod())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])}
    sets = {
        "data.table": digits_table,
        "runtime.strategy": "horovod",
        "runtime.np": np_,
        "tracking.uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "runtime.run_dir": str(tmp_path / "run"),
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run(
        [sys.executable, "-m", "keras_dl.cli", "train", "digits", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "needs Horovod, but `import horovod.tensorflow` failed" in proc.stderr
    assert "blocked by the test" in proc.stderr and "build_horovod.sh" in proc.stderr


@pytest.mark.slow
def test_a_rendezvous_that_times_out_names_the_rank_that_never_came():
    """Gloo's "Wait timeout after 3 seconds for key(s): 1" (a native abort of rank 0) was
    "rank 0 died: killed by signal 6"; it is the rank that never reached hvd.init()."""
    from keras_dl.launch import HorovodRunner
    from tests.distribute.workers import init_late_on_rank_1

    runner = HorovodRunner(np=-2, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "3"})
    began = time.monotonic()
    with pytest.raises(DistributedError) as caught:
        runner.run(init_late_on_rank_1, pause=120)
    text = str(caught.value)
    assert text.startswith("Horovod rank 0 on host "), text
    assert (
        "waited 3 s at the Gloo rendezvous (the driver's HTTP store) for rank(s) 1 (on host" in text
    )
    assert "raise HOROVOD_GLOO_TIMEOUT_SECONDS" in text and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in text
    assert time.monotonic() - began < 100  # rank 1, asleep for 120 s, was stopped
