"""Several processes creating one fresh SQLite tracking store at once: MLflow's first-use
migrations raced ("table ... already exists", "duplicate column": 7 of 9 processes failed
here); keras_dl builds the store under a file lock."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, runs_in

SCRIPT = """
import sys
import mlflow
from keras_dl.tracking import setup_mlflow
setup_mlflow(sys.argv[1], "shared")
with mlflow.start_run():
    mlflow.log_param("p", 1)
"""


@pytest.mark.slow
def test_processes_creating_one_fresh_store_at_once_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the folder exists, the store does not
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT, uri], env=env, stderr=subprocess.PIPE,
                         text=True)
        for _ in range(4)
    ]  # fmt: skip
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-800:] for e in errors]
    assert len(runs_in(uri)) == 4


@pytest.mark.parametrize("where", ["checkout", "elsewhere", "on_path", "none"])
def test_the_ui_hint_names_this_environments_mlflow(tmp_path, monkeypatch, where):
    """It printed .venv/bin/mlflow whatever the install (wrong after pip install keras-dl)."""
    from keras_dl.tracking import ui_command

    work = tmp_path / "work"
    work.mkdir()
    bin_dir = (work / ".venv" / "bin") if where == "checkout" else (tmp_path / "env" / "bin")
    bin_dir.mkdir(parents=True)
    if where != "none":
        (bin_dir / "mlflow").write_text("#!/bin/sh\n")
        (bin_dir / "mlflow").chmod(0o755)
    monkeypatch.setattr("sys.executable", str(bin_dir / "python"))
    monkeypatch.chdir(work)
    monkeypatch.setenv("PATH", str(bin_dir) if where == "on_path" else "/usr/bin")
    expected = {
        "checkout": ".venv/bin/mlflow",
        "elsewhere": str(bin_dir / "mlflow"),
        "on_path": "mlflow",
        "none": "mlflow",
    }[where]
    uri = f"sqlite:///{work / 'mlflow.db'}"
    assert ui_command(uri) == f"{expected} ui --backend-store-uri sqlite:///mlflow.db --port 5000"
