"""A rank's own keras_dl error reaches the user as that error: its class, exit code and text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from keras_dl.distribute.failures import explain_failure, report_failure
from keras_dl.errors import DataError, DistributedError, DivergenceError, RunError
from tests.conftest import HEAVY, REPO, runs_in, write_test_table
from tests.distribute.test_failure_messages import HOROVOD, SHUTDOWN


def _table_with_a_ragged_second_file(tmp_path) -> tuple[str, str]:
    """A digits-like table of two files of 40 rows; the file the table lists second has a
    row of 63 pixels. Returns the table and that file."""
    import pyarrow.parquet as pq

    from keras_dl.data.tables import open_table

    rng = np.random.default_rng(0)
    for attempt in range(20):  # delta-rs names files by a random uuid: their order is random
        table = str(tmp_path / f"table{attempt}")
        for ragged in (False, True):
            pixels = [rng.random(64).tolist() for _ in range(40)]
            if ragged:
                pixels[20] = pixels[20][:63]
            rows = {"pixels": pixels, "label": rng.integers(0, 10, 40), "split": ["train"] * 40}
            write_test_table(table, pa.table(rows), rows_per_group=40, mode="append")
        files = open_table(table).files
        lengths = pq.read_table(files[1], columns=["pixels"])["pixels"].combine_chunks()
        if min(lengths.value_lengths().to_pylist()) == 63:
            return table, files[1]
    raise AssertionError("the ragged file never came second")


def _reported(capsys, monkeypatch, exc: BaseException, rank: int = 1) -> str:
    """What ``report_failure`` writes on rank ``rank`` for ``exc``."""
    monkeypatch.setenv("HOROVOD_RANK", str(rank))
    try:
        raise exc
    except BaseException as raised:
        report_failure(raised)
    return capsys.readouterr().err


def _explain(tmp_path, reports: dict[int, str], first: int = 1, code: int = 1):
    for rank, text in reports.items():
        (tmp_path / f"rank.{rank}").mkdir()
        (tmp_path / f"rank.{rank}" / "stderr").write_text(f"noise\n{text}")
    exc = RuntimeError(HOROVOD.format(rank=first, code=code))
    return explain_failure(exc, str(tmp_path), size=2)


def test_a_data_error_on_one_rank_is_raised_as_that_data_error_with_its_whole_text(
    tmp_path, capsys, monkeypatch
):
    long_path = "s3://lake/" + "deep/" * 80 + "part-00001.parquet"  # past the 600-char summary
    text = f"File {long_path!r} is not readable Parquet (magic bytes\nnot found).  Restore it."
    shutdown = _reported(capsys, monkeypatch, RuntimeError(SHUTDOWN), rank=0)
    error = _explain(tmp_path, {0: shutdown, 1: _reported(capsys, monkeypatch, DataError(text))})
    assert type(error) is DataError and error.exit_code == DataError.exit_code
    assert str(error).startswith(f"Horovod rank 1 failed: DataError: {text} (")  # not cut
    assert "lines prefixed [1]" in str(error)


class _ElsewhereDataError(DataError):  # a subclass outside keras_dl.errors: its nearest base there
    pass


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (DivergenceError("Training diverged: loss grew"), DivergenceError),
        (RunError("disk full"), RunError),
        (_ElsewhereDataError("bad rows"), DataError),
        (ValueError("not ours"), DistributedError),  # any other exception: as before
    ],
)
def test_keras_dl_errors_keep_their_class_others_stay_distributed_errors(
    tmp_path, capsys, monkeypatch, exc, expected
):
    error = _explain(tmp_path, {1: _reported(capsys, monkeypatch, exc)})
    assert type(error) is expected, repr(error)
    assert f"rank 1 failed: {type(exc).__name__}: {exc}" in str(error)


def test_a_report_names_only_keras_dl_error_classes_and_nothing_runs_from_it(tmp_path):
    """The report is a class name looked up among keras_dl.errors' own, and a JSON string."""
    forged = {
        1: 'keras_dl rank error: rank=1 class=system name=os message="echo pwned"\n'
        "keras_dl rank failed: rank=1 secondary=0 cause=ValueError: x\n",
    }
    error = _explain(tmp_path, forged)
    assert type(error) is DistributedError and "ValueError: x" in str(error)
    (tmp_path / "b").mkdir()
    subclass = {
        1: f"keras_dl rank error: rank=1 class=Preempted name=P message={json.dumps('x')}\n"
        "keras_dl rank failed: rank=1 secondary=0 cause=ValueError: x\n",
    }
    assert type(_explain(tmp_path / "b", subclass)) is DistributedError  # not one we rebuild


@HEAVY
@pytest.mark.slow
def test_a_bad_file_read_by_rank_1_exits_the_cli_with_data_errors_code(tmp_path):
    """Two files, no shuffle: rank 0 trains the first, rank 1 the second, in which one row's
    pixels are one value short (the shape comes from the first file's first row group)."""
    table, victim = _table_with_a_ragged_second_file(tmp_path)
    sets = {
        "data.table": table,
        "data.validation_split": "",
        "data.test_split": "",
        "data.shuffle": "false",
        "data.cache": "never",  # the memory cache fills from the whole split on every rank
        "train.batch_size": "16",
        "train.epochs": "1",
        "runtime.strategy": "horovod",
        "runtime.np": "-2",
        "tracking.uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "runtime.run_dir": str(tmp_path / "run"),
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run(
        [sys.executable, "-m", "keras_dl.cli", "train", "digits", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    print(error)
    assert proc.returncode == DataError.exit_code, proc.stderr[-3000:]
    assert error.startswith("error: Horovod rank 1 failed: DataError: List column 'pixels'"), error
    assert f"in file {victim!r}, row group 0" in error
    assert error.rstrip().endswith("The other ranks were stopped."), error  # the whole text
    # The driver ended the run FAILED with the rank's own error as its cause.
    (run,) = runs_in(sets["tracking.uri"])
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"].startswith("DataError: Horovod rank 1 failed: ")


def test_a_collective_that_timed_out_waiting_for_other_workers_is_a_secondary_failure(
    capsys, monkeypatch
):
    """TF's DeadlineExceededError of a collective whose timeout (runtime.stall_timeout) ran out:
    a peer never joined, so this worker's failure is not the cause (its failed line says
    secondary=1, and the driver looks for the peer's report or the lost peer)."""
    cause = (
        "Graph execution error:\n\nDetected at node adam/CollectiveReduceV2 defined at ...\n"
        "Collective has timed out waiting for other workers.\n\t [[{{node adam/CollectiveReduceV2}}]]"
    )
    text = _reported(capsys, monkeypatch, RuntimeError(cause))
    assert "keras_dl rank failed: rank=1 secondary=1 cause=RuntimeError: Graph execution" in text
