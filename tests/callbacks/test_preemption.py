"""Preemption with real signals: SIGTERM mid-epoch checkpoints, exits 75, and resumes."""

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
from keras_dl.callbacks.preemption import PREEMPTED_EXIT
from tests.conftest import HEAVY_IO, REPO, runs_in, seed_store

pytestmark = HEAVY_IO  # see tests/conftest.py

EPOCHS = 4
STEPS = 40  # 1,257 training rows in batches of 32: 39 whole and a last one of 9


def _command(table: str, tmp: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipes.digits",
        *("--set", f"data.table={table}"),
        *("--set", f"train.epochs={EPOCHS}"),
        *("--set", f"runtime.run_dir={tmp / 'run'}"),
        *("--set", f"tracking.uri={seed_store(tmp / 'mlflow.db')}"),
        *("--set", "tracking.log_model=false"),
        *("--set", "callbacks.plots=false"),
        *("--set", "train.verbose=2"),
    ]


def _env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_epoch_checkpoints_that_step_and_the_rerun_resumes_it(
    digits_table, tmp_path, sig
):
    cmd = _command(digits_table, tmp_path)
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while "Epoch 2/" not in log_path.read_text():  # printed when epoch 2 starts
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "training never reached epoch 2"
                time.sleep(0.01)
            # At once: the handler lets the current step finish, so the checkpoint is inside
            # epoch 2 (an epoch is ~0.1-0.5 s here: a fixed wait could overshoot into epoch 3).
            sent = time.monotonic()
            proc.send_signal(sig)
            code = proc.wait(30)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log_path.read_text()
    assert code == PREEMPTED_EXIT, output[-3000:]
    print(f"exited {took:.1f} s after {sig.name}")
    assert f"Preempted by {sig.name}: stopped after step" in output

    # The checkpoint of the step the signal interrupted: mid-epoch 2.
    ckpts = tmp_path / "run" / "checkpoints"
    last = read_header(list_checkpoints(ckpts)[-1])
    assert STEPS < last["global_step"] < 2 * STEPS and last["step"] > 0, last
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "KILLED"
    assert run.data.tags["preempted"] == sig.name
    assert "Preempted" in run.data.tags["keras_dl.failure"]
    client = mlflow.MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0]
    # A preempted run has no report yet: the rerun that ends it writes one.
    assert "report.html" not in {a.path for a in client.list_artifacts(run.info.run_id)}

    resumed = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    text = resumed.stdout + resumed.stderr
    assert f"Resuming from checkpoint ckpt-{last['global_step']:09d}.npz" in text
    assert re.findall(r"^Epoch (\d+)/", text, re.M) == ["2", "3", "4"]
    (run,) = runs_in(uri)  # the same run, now FINISHED
    assert run.info.status == "FINISHED"
    # Without the first attempt's tags: they would say a finished run was preempted.
    assert not {"preempted", "keras_dl.failure"} & set(run.data.tags), run.data.tags
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(EPOCHS)), steps
    assert read_header(list_checkpoints(ckpts)[-1])["global_step"] == EPOCHS * STEPS
    assert "report.html" in {a.path for a in client.list_artifacts(run.info.run_id)}


# A fit in a process that goes on after it (a notebook's kernel, a test's own process): SIGTERM
# at step 2, a 1 s grace, then 3 s more in the same process, which must still be alive.
_GOES_ON = """
import os, signal, sys, time
import keras
from keras_dl.callbacks.preemption import Preemption
from keras_dl.errors import Preempted
from tests.callbacks.helpers import tiny_data, tiny_model

class Sigterm(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            os.kill(os.getpid(), signal.SIGTERM)

x, y = tiny_data(rows=64)
try:
    tiny_model().fit(x, y, epochs=2, batch_size=16, verbose=0,
                     callbacks=[Sigterm(), Preemption(grace=1.0)])
except Preempted as exc:
    print("preempted:", exc, flush=True)
time.sleep(3)
print("alive", flush=True)
"""


def test_a_handled_preemption_calls_off_its_forced_exit_and_the_process_goes_on(tmp_path):
    """The grace timer bounds a step that never ends; once the step ended and ``Preempted`` was
    raised, it must not end the process 25 s later (it used to: an interrupted notebook's
    kernel died, and so did a pytest worker that preempted a fit in-process)."""
    script = tmp_path / "goes_on.py"
    script.write_text(_GOES_ON)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "preempted:" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0 and "alive" in proc.stdout, (proc.returncode, proc.stdout)
