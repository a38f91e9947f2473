"""The command line: bad input ends in one clear paragraph, a non-zero exit, and no RUNNING run."""

import os

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.conftest import cli_in_process, run_cli, runs_in


def _train(table, tmp_path, *sets, run=run_cli):
    """``keras-dl train digits``; ``run=cli_in_process`` for an error found before ``fit``."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run(
        "train",
        "digits",
        "--set",
        f"data.table={table}",
        "--set",
        f"tracking.uri={uri}",
        "--set",
        "train.epochs=1",
        *[a for s in sets for a in ("--set", s)],
        cwd=tmp_path,
    )
    return proc, uri


def _assert_clear_failure(proc, uri, *fragments):
    assert proc.returncode == 2, proc.stderr
    # TensorFlow's C++ start-up lines may come first; the error is one paragraph at the end.
    lines = proc.stderr.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(starts) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    text = " ".join(lines[starts[0] :])
    assert len(text) < 1200, text
    for fragment in fragments:
        assert fragment in text, text
    db = uri[len("sqlite:///") :]
    if os.path.exists(db):
        assert all(r.info.status != "RUNNING" for r in runs_in(uri))


@pytest.mark.slow
def test_missing_table(tmp_path):
    proc, uri = _train(tmp_path / "nope", tmp_path)
    _assert_clear_failure(proc, uri, "does not exist", "keras-dl ingest sklearn-digits")


@pytest.mark.slow
def test_column_the_table_lacks_lists_its_columns(digits_table, tmp_path):
    proc, uri = _train(digits_table, tmp_path, "data.label=digit")
    _assert_clear_failure(proc, uri, "'digit'", "pixels, label, split")


@pytest.mark.slow
def test_non_numeric_feature_column(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(
        table, pa.table({"pixels": [f"p{i}" for i in range(64)], "label": np.arange(64) % 10})
    )
    proc, uri = _train(table, tmp_path, "data.split_column=null")
    _assert_clear_failure(proc, uri, "'pixels'", "type string")


@pytest.mark.slow
def test_empty_table(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(
        table,
        pa.table(
            {"pixels": pa.array([], pa.list_(pa.float32())), "label": pa.array([], pa.int64())}
        ),
    )
    proc, uri = _train(table, tmp_path, "data.split_column=null")
    _assert_clear_failure(proc, uri, "is empty")


@pytest.mark.slow
def test_delta_version_that_does_not_exist(digits_table, tmp_path):
    proc, uri = _train(digits_table, tmp_path, "data.version=5")
    _assert_clear_failure(proc, uri, "no version 5")


def test_unknown_config_key_fails_before_any_work(tmp_path):
    proc, uri = _train(tmp_path / "nope", tmp_path, "train.epoch=3", run=cli_in_process)
    _assert_clear_failure(proc, uri, "Unknown config key 'train.epoch'", "train.epochs")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_ingest_then_train_module_entry(tmp_path):
    table = str(tmp_path / "digits")
    proc = run_cli("ingest", "sklearn-digits", "--to", table, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1797 rows" in proc.stdout and "version 0" in proc.stdout
    again = run_cli("ingest", "sklearn-digits", "--to", table, cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr
    ignored = run_cli("ingest", "sklearn-digits", "--to", table, "--mode", "ignore", cwd=tmp_path)
    assert ignored.returncode == 0 and "version 0" in ignored.stdout
    proc = run_cli(
        "-m",
        "recipes.digits",
        "--set",
        f"data.table={table}",
        "--set",
        "train.epochs=1",
        "--set",
        "train.verbose=0",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "run id: " in proc.stdout and "test_accuracy: " in proc.stdout
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in proc.stdout
    (run,) = runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.info.status == "FINISHED"


def test_recipes_lists_digits():
    proc = cli_in_process("recipes")
    assert proc.returncode == 0 and "digits" in proc.stdout and "epochs=30" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "item, fragments, run",
    [
        # Checked against the table in fit, after the store watchdog starts: its own process.
        pytest.param(
            "model.num_classes=3",
            ("model.num_classes=3 is too few", "--set model.num_classes=10"),
            run_cli,
            id="model.num_classes=3-fragments0",
        ),
        # Refused while the config resolves, before fit: in this process.
        pytest.param(
            "model.dropout=2",
            ("model.dropout=2.0 is outside the allowed range [0, 1)",),
            cli_in_process,
            id="model.dropout=2-fragments1",
        ),
    ],
)
def test_model_values_exit_2_before_any_mlflow_run(digits_table, tmp_path, item, fragments, run):
    proc, uri = _train(digits_table, tmp_path, item, run=run)
    _assert_clear_failure(proc, uri, *fragments)
    assert not os.path.exists(uri[len("sqlite:///") :]) or runs_in(uri) == []


def test_errors_wrap_only_at_a_terminal_and_never_inside_a_path(monkeypatch):
    """Found when a long tmp path moved the wrap into "already exists": a pipe gets the error on
    one line, and a terminal gets it wrapped at 100 columns with every path whole."""
    import io
    import sys

    from keras_dl import cli

    path = "/tmp/" + "x" * 120 + "/digits"
    text = f"Delta table '{path}' already exists. Pass --mode overwrite to replace it."
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe, as in CI and logs
    assert cli._for_stderr(text) == text

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    lines = cli._for_stderr(text).splitlines()
    assert len(lines) > 1 and any(f"'{path}'" in line for line in lines)
    assert all(len(line) <= 100 for line in lines if path not in line)


def test_cli_in_process_puts_back_what_the_command_set(tmp_path, monkeypatch):
    """What the in-process CLI tests rely on: promote sets MLflow's tracking URI (and with it
    MLFLOW_TRACKING_URI) for the whole process, bench tabular sets TF_CPP_MIN_LOG_LEVEL, and
    every command adds its warning filter; none of it outlives the call, nor does the cwd."""
    import logging
    import warnings

    import mlflow

    from tests.conftest import seed_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    uri = seed_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    before = (dict(os.environ), mlflow.get_tracking_uri(), os.getcwd(), warnings.filters[:])
    handlers = logging.getLogger().handlers[:]
    (tmp_path / "elsewhere").mkdir()

    promoted = cli_in_process("promote", "digits", "1", "--tracking-uri", uri)
    benched = cli_in_process("bench", "tabular", "--datasets", "wine", cwd=tmp_path / "elsewhere")

    assert promoted.returncode == 2 and "no registered model 'digits'" in promoted.stderr
    assert benched.returncode == 2 and "--datasets 'wine'" in benched.stderr
    after = (dict(os.environ), mlflow.get_tracking_uri(), os.getcwd(), warnings.filters[:])
    assert after == before
    assert logging.getLogger().handlers == handlers
