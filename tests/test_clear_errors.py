"""Clear errors, early, for mistakes a new user makes: each names the key or file and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import mlflow
import pytest

from keras_dl.errors import ConfigError
from tests.conftest import REPO, cli_in_process, runs_in, train_digits


def test_a_deleted_experiment_is_named_with_how_to_restore_it(digits_table, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    client.delete_experiment(client.create_experiment("digits"))
    with pytest.raises(
        ConfigError,
        match=r"MLflow experiment 'digits' \(id \d+\) in sqlite:.* is deleted.*"
        r"mlflow experiments restore --experiment-id \d+.*--set tracking.experiment=NAME",
    ):
        train_digits(digits_table, tmp_path, "train.epochs=1")
    assert runs_in(uri) == []


def test_an_unreachable_tracking_server_fails_at_once(digits_table, tmp_path):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"tracking.uri=http://127.0.0.1:9 cannot be reached"):
        train_digits(digits_table, tmp_path, "tracking.uri=http://127.0.0.1:9")
    assert time.monotonic() - start < 30  # MLflow's own retries take minutes
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_sqlite_store_in_a_missing_folder_is_named(digits_table, tmp_path):
    with pytest.raises(ConfigError, match=r"points into .*nowhere, which does not exist"):
        train_digits(digits_table, tmp_path, f"tracking.uri=sqlite:///{tmp_path}/nowhere/m.db")


def test_predict_refuses_a_batch_size_below_one(tmp_path):
    out = cli_in_process(
        "predict",
        *("--model", "models:/digits/1", "--table", str(tmp_path / "t")),
        *("--out", str(tmp_path / "o"), "--batch-size", "0"),
    )
    assert out.returncode == 2
    assert "argument --batch-size: must be an integer >= 1, got 0" in out.stderr


_UNGUARDED = """
from keras_dl.launch import HorovodRunner


def main():
    return 1


print(HorovodRunner(np=-2).run(main))
"""

_GUARDED = _UNGUARDED.replace("print(", 'if __name__ == "__main__":\n    print(')


def test_horovod_runner_in_a_script_without_a_main_guard_says_to_add_one(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(_UNGUARDED)
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PYTHONPATH": str(REPO),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "KERAS_DL_DEFER_KERAS_EXTRAS": os.environ.get("KERAS_DL_DEFER_KERAS_EXTRAS", ""),
        },
    )
    assert out.returncode != 0
    assert "bootstrapping phase" not in out.stderr
    assert (
        f"HorovodRunner.run is called at the top level of {script} (line 9), outside "
        '`if __name__ == "__main__":`'
    ) in out.stderr
    assert time.monotonic() - start < 60  # no Horovod process was started


def test_the_guard_check_passes_a_guarded_script(tmp_path):
    from keras_dl.distribute.mainguard import _guarded

    script = tmp_path / "ok.py"
    script.write_text(_GUARDED)
    assert _guarded(script, 10)
    script.write_text(_UNGUARDED)
    assert not _guarded(script, 9)
