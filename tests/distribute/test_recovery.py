"""Automatic recovery (runtime.max_restarts) and preemption under Horovod, with real ranks."""

from __future__ import annotations

import functools

import mlflow
import pytest

from keras_dl.callbacks.checkpoint import list_checkpoints, read_header
from keras_dl.distribute.recovery import restartable
from keras_dl.errors import DistributedError, Preempted
from keras_dl.launch import launch
from tests.conftest import HEAVY, runs_in
from tests.distribute.workers import train_with_fault

pytestmark = HEAVY  # see tests/conftest.py

# The 1,257 training rows split 629/628 between 2 ranks; every rank runs the larger shard's
# batches of 16, the last one padded: ceil(629 / 16) = 40 steps per epoch.
STEPS = 40
# The fault lands at epoch 1, batch 1, seen by the driver's callbacks 2 steps later: the ranks
# stop together after this step.
STOP = STEPS + 3


def test_only_deaths_preemptions_and_stalls_are_restarted():
    assert restartable(Preempted("SIGTERM", 3))
    assert restartable(DistributedError("Horovod rank 1 died: killed by signal 9 (SIGKILL), ..."))
    assert restartable(DistributedError("Horovod rank 0 failed: StallError: rank 0 waited ..."))
    assert not restartable(DistributedError("Horovod rank 1 failed: DataError: no such column"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "cause"),
    [("kill", r"rank 1 died"), ("sigterm", rf"Preempted by SIGTERM: stopped after step {STOP}\b")],
)
def test_a_lost_or_preempted_rank_is_relaunched_in_the_same_run(digits_exp, tmp_path, mode, cause):
    exp = digits_exp(
        "runtime.strategy=horovod", "runtime.np=-2", "train.epochs=2", "runtime.max_restarts=1"
    )
    stamp = tmp_path / "fault_time"
    main = functools.partial(
        train_with_fault, mode=mode, rank=1, epoch=1, batch=1, stamp=str(stamp), once=True
    )
    history = launch(exp, main=main)
    assert stamp.exists(), "the fault was never injected"
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["keras_dl.restarts"] == 1
    assert pytest.importorskip("re").search(cause, run.data.tags["keras_dl.restart.1"])
    client = mlflow.MlflowClient(exp.tracking.uri)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]
    ckpts = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert read_header(ckpts[-1])["global_step"] == 2 * STEPS
    if mode == "sigterm":  # resumed mid-epoch: the second attempt ran only epoch 2's rest
        assert list(history["loss"]) and len(history["loss"]) == 1


@pytest.mark.slow
def test_a_preempted_rank_stops_every_rank_after_the_same_step(digits_exp, tmp_path):
    exp = digits_exp("runtime.strategy=horovod", "runtime.np=-2", "train.epochs=2")
    main = functools.partial(
        train_with_fault, mode="sigterm", rank=1, epoch=1, batch=1, stamp=str(tmp_path / "s")
    )
    with pytest.raises(Preempted, match=rf"Preempted by SIGTERM: stopped after step {STOP}\b"):
        launch(exp, main=main)  # runtime.max_restarts=0: the default does not restart
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "KILLED" and run.data.tags["preempted"] == "SIGTERM"
    last = read_header(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    # The signal came after epoch 2's second step; the ranks agreed after its third.
    assert (last["epoch"], last["step"]) == (1, 3)


@pytest.mark.slow
def test_sigterm_to_the_driver_reaches_every_rank_and_the_job_resumes(digits_table, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from keras_dl.errors import PREEMPTED_EXIT
    from tests.conftest import REPO, seed_store

    uri = seed_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    cmd = [
        sys.executable,
        "-m",
        "keras_dl.cli",
        "train",
        "digits",
        *("--set", f"data.table={digits_table}"),
        *("--set", "data.validation_split="),
        *("--set", f"tracking.uri={uri}"),
        *("--set", f"runtime.run_dir={tmp_path / 'run'}"),
        *("--set", "runtime.strategy=horovod", "--set", "runtime.np=-2"),
        *("--set", "train.epochs=3", "--set", "train.verbose=2"),
        *("--set", "tracking.log_model=false", "--set", "callbacks.plots=false"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    log_path = tmp_path / "driver.log"
    with open(log_path, "w") as out:
        # Its own process group, so that a driver that does not stop is ended with its ranks.
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 300
            while "Epoch 2/" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "training never reached epoch 2"
                time.sleep(0.05)
            time.sleep(0.3)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)  # no wait for runtime.stall_timeout; loose for a loaded host
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    output = log_path.read_text()
    assert code == PREEMPTED_EXIT, output[-3000:]
    print(f"the driver exited {took:.1f} s after SIGTERM")
    assert "Preempted by SIGTERM" in output
    (run,) = runs_in(uri)
    assert run.info.status == "KILLED" and run.data.tags["preempted"] == "SIGTERM"
    last = read_header(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    assert STEPS < last["global_step"] < 2 * STEPS  # mid-epoch 2

    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    client = mlflow.MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2]


@pytest.mark.slow
def test_a_lost_multi_worker_worker_is_relaunched_in_the_same_run(digits_exp, tmp_path):
    """TF's MultiWorkerMirroredStrategy: worker 1 SIGKILLed mid-epoch 2 ends the other; the
    job restarts from the newest checkpoint in the same run and trains every row once."""
    exp = digits_exp(
        "runtime.strategy=multiworker", "runtime.np=-2", "train.epochs=2", "runtime.max_restarts=1"
    )
    stamp = tmp_path / "fault_time"
    main = functools.partial(
        train_with_fault, mode="kill", rank=1, epoch=1, batch=1, stamp=str(stamp), once=True
    )
    launch(exp, main=main)
    assert stamp.exists(), "the fault was never injected"
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["keras_dl.restarts"] == 1
    assert "1 died" in run.data.tags["keras_dl.restart.1"], run.data.tags["keras_dl.restart.1"]
    client = mlflow.MlflowClient(exp.tracking.uri)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]
    rows = int(run.data.params["data.train_rows"])
    trained = client.get_metric_history(run.info.run_id, "rows_trained")
    assert sorted((m.step, m.value) for m in trained) == [(0, rows), (1, rows)]
