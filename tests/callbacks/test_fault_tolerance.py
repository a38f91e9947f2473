"""Fault tolerance with real processes: kill -9 mid-training and resume from the checkpoints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from keras_dl.callbacks.checkpoint import list_checkpoints, read_header
from tests.conftest import REPO, runs_in

EPOCHS = 6
STEPS = 39  # 1,257 training rows // batch 32


def _command(table: str, tmp: Path, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipes.digits",
        *("--set", f"data.table={table}"),
        *("--set", f"train.epochs={EPOCHS}"),
        *("--set", f"runtime.run_dir={tmp / name}"),
        *("--set", f"tracking.uri=sqlite:///{tmp / (name + '.db')}"),
        *("--set", "tracking.log_model=false"),
        *("--set", "data.deterministic=true"),  # the same row order in every run
        *("--set", "callbacks.checkpoint_every_n_steps=10"),  # so the kill lands mid-epoch
        *("--set", "callbacks.keep_checkpoints=2"),
        *("--set", "callbacks.plots=false"),
    ]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.slow
def test_kill_9_mid_epoch_resumes_the_same_run(digits_table, tmp_path):
    # That the resumed weights equal an uninterrupted run's is checked exactly (2 ranks,
    # preempted mid-epoch) in tests/distribute/test_exact_resume.py.
    cmd = _command(digits_table, tmp_path, "run")
    ckpts = tmp_path / "run" / "checkpoints"
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            # Kill once training is past its second epoch, at whatever step it is then.
            while not any(int(p.name[5:14]) > 2 * STEPS for p in list_checkpoints(ckpts)):
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint appeared"
                time.sleep(0.05)
            time.sleep(0.3)  # land somewhere inside a later step
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    good = list_checkpoints(ckpts)
    assert good and not (ckpts / "COMPLETE").exists()
    last = read_header(good[-1])
    assert last["global_step"] < EPOCHS * STEPS, "training ended before the kill"
    # A kill during a non-atomic write would have left a truncated newer file: add one, and a
    # temp file as our own writer leaves it when killed mid-write.
    data = good[-1].read_bytes()
    (ckpts / f"ckpt-{last['global_step'] + 5:09d}.npz").write_bytes(data[: len(data) // 2])
    (ckpts / f".ckpt-{last['global_step'] + 6:09d}.npz.tmp-99999").write_bytes(data[:100])

    resumed = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stdout + resumed.stderr
    assert f"Resuming from checkpoint {good[-1].name}" in output, output[-3000:]
    assert "Skipping unreadable checkpoint" in output
    epochs_run = [int(e) for e in re.findall(r"^Epoch (\d+)/", output, re.M)]
    assert epochs_run == list(range(last["epoch"] + 1, EPOCHS + 1)), output[-3000:]

    # One MLflow run, every epoch metric exactly once per epoch.
    uri = f"sqlite:///{tmp_path / 'run.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    assert f"run id: {run.info.run_id}" in resumed.stdout
    client = mlflow.MlflowClient(uri)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == list(range(EPOCHS)), (key, steps)

    # No partial files: only complete, loadable checkpoints (and the completion marker).
    names = sorted(p.name for p in ckpts.iterdir())
    assert all(re.fullmatch(r"ckpt-\d{9}\.npz|COMPLETE", n) for n in names), names
    assert len(list_checkpoints(ckpts)) == 2
    for p in list_checkpoints(ckpts):
        read_header(p)
    assert read_header(list_checkpoints(ckpts)[-1])["global_step"] == EPOCHS * STEPS
