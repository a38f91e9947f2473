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
from tests.conftest import HEAVY_IO, REPO, runs_in, seed_store
from tests.warm_python import real_pid, wait_ended

pytestmark = HEAVY_IO  # see tests/conftest.py

EPOCHS = 6
STEPS = 40  # 1,257 training rows in batches of 32: 39 whole and a last one of 9


def _command(table: str, tmp: Path, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipes.digits",
        *("--set", f"data.table={table}"),
        *("--set", f"train.epochs={EPOCHS}"),
        *("--set", f"runtime.run_dir={tmp / name}"),
        *("--set", f"tracking.uri={seed_store(tmp / (name + '.db'))}"),
        *("--set", "tracking.log_model=false"),
        *("--set", "data.deterministic=true"),  # the same row order in every run
        *("--set", "callbacks.checkpoint_every_n_steps=10"),  # so the kill lands mid-epoch
        *("--set", "callbacks.keep_checkpoints=2"),
        *("--set", "callbacks.plots=false"),
    ]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


def _kill_9_once(cmd: list[str], log_path: Path, ready, what: str) -> int:
    """Start ``cmd``, SIGKILL it a little after ``ready()`` turns true (inside a later step).

    Returns:
        The killed process's pid.
    """
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not ready():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, what
                time.sleep(0.05)
            time.sleep(0.3)  # land somewhere inside a later step
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
            wait_ended(proc)  # a warm command's own process too (tests/warm_python.py)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return real_pid(proc.pid)


@pytest.mark.slow
def test_kill_9_mid_epoch_resumes_the_same_run(digits_table, tmp_path):
    # That the resumed weights equal an uninterrupted run's is checked exactly (2 ranks,
    # preempted mid-epoch) in tests/distribute/test_exact_resume.py.
    cmd = _command(digits_table, tmp_path, "run")
    ckpts = tmp_path / "run" / "checkpoints"
    # Kill once training is past its second epoch, at whatever step it is then.
    _kill_9_once(
        cmd,
        tmp_path / "first.log",
        lambda: any(int(Path(p).name[5:14]) > 2 * STEPS for p in list_checkpoints(ckpts)),
        "no checkpoint appeared",
    )
    good = [Path(p) for p in list_checkpoints(ckpts)]
    assert good and not (ckpts / "COMPLETE").exists()
    last = read_header(good[-1])
    assert last["global_step"] < EPOCHS * STEPS, "training ended before the kill"
    # A kill during a non-atomic write would have left a truncated newer file: add one, and the
    # temp files our writer (and the rename-based one before manifests) leave when killed.
    data = good[-1].read_bytes()
    (ckpts / f"ckpt-{last['global_step'] + 5:09d}.npz").write_bytes(data[: len(data) // 2])
    (ckpts / f"ckpt-{last['global_step'] + 6:09d}.npz.99999.tmp").write_bytes(data[:100])
    (ckpts / f".ckpt-{last['global_step'] + 7:09d}.npz.tmp-99999").write_bytes(data[:100])

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

    # No partial files: only complete, loadable checkpoints, their manifests and the marker.
    names = sorted(p.name for p in ckpts.iterdir())
    assert all(re.fullmatch(r"ckpt-\d{9}\.(npz|json)|COMPLETE", n) for n in names), names
    assert len(names) == 5, names
    assert len(list_checkpoints(ckpts)) == 2
    for p in list_checkpoints(ckpts):
        read_header(p)
    assert read_header(list_checkpoints(ckpts)[-1])["global_step"] == EPOCHS * STEPS


@pytest.mark.slow
def test_kill_9_with_run_dir_on_s3_resumes_from_the_bucket_in_the_same_run(
    digits_table, tmp_path, s3
):
    import json

    import boto3

    run_dir = s3.uri("runs/digits")
    cmd = [
        f"runtime.run_dir={run_dir}" if a.startswith("runtime.run_dir=") else a
        for a in _command(digits_table, tmp_path, "run")
    ]
    cmd += ["--set", "runtime.lease_seconds=3"]  # the dead holder's lease lapses quickly
    client = boto3.client("s3")

    def manifests() -> list[int]:
        listed = client.list_objects_v2(Bucket=s3.name, Prefix="runs/digits/checkpoints/")
        names = [o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", [])]
        return sorted(int(n[5:14]) for n in names if re.fullmatch(r"ckpt-\d{9}\.json", n))

    # Kill once a checkpoint past the first epoch counts (its manifest is written).
    pid = _kill_9_once(
        cmd,
        tmp_path / "first.log",
        lambda: any(step > STEPS for step in manifests()),
        "no checkpoint manifest appeared",
    )
    steps = manifests()
    last = steps[-1]
    assert last < EPOCHS * STEPS, "training ended before the kill"
    lease = client.get_object(Bucket=s3.name, Key="runs/digits/.lease.json")["Body"].read()
    assert json.loads(lease)["pid"] == pid  # the killed run could not release it
    # An upload killed before its manifest: newer than the last valid checkpoint, never resumed.
    client.put_object(
        Bucket=s3.name, Key=f"runs/digits/checkpoints/ckpt-{last + 5:09d}.npz", Body=b"partial"
    )
    time.sleep(max(0.0, json.loads(lease)["expires"] - time.time()) + 0.5)

    resumed = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stdout + resumed.stderr
    assert f"Resuming from checkpoint ckpt-{last:09d}.npz" in output, output[-3000:]
    assert "Resuming MLflow run" in output and f"{run_dir}/run.json" in output
    epochs_run = [int(e) for e in re.findall(r"^Epoch (\d+)/", output, re.M)]
    first_epoch = last // STEPS + 1  # 1-based: the epoch the checkpoint was taken in
    assert epochs_run == list(range(first_epoch, EPOCHS + 1)), output[-3000:]

    # One MLflow run, every epoch metric exactly once per epoch.
    uri = f"sqlite:///{tmp_path / 'run.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    client_ml = mlflow.MlflowClient(uri)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        history = [m.step for m in client_ml.get_metric_history(run.info.run_id, key)]
        assert sorted(history) == list(range(EPOCHS)), (key, history)

    # Only counted checkpoints are left (the partial upload was older than the newest by now),
    # the completion marker, and no lease.
    listed = client.list_objects_v2(Bucket=s3.name, Prefix="runs/digits/")
    keys = sorted(o["Key"] for o in listed["Contents"] if not o["Key"].endswith("/"))
    final = f"ckpt-{EPOCHS * STEPS:09d}"
    assert f"runs/digits/checkpoints/{final}.json" in keys
    assert "runs/digits/.lease.json" not in keys
    leftovers = [k for k in keys if k.endswith(".npz") and k[:-4] + ".json" not in keys]
    assert leftovers == [], keys
    assert manifests()[-1] == EPOCHS * STEPS and len(manifests()) == 2
