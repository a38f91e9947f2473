"""COMPLETE only when all is done: a failure after training keeps the checkpoints, and the
rerun redoes only the missing steps."""

from __future__ import annotations

import mlflow
import pytest

from keras_dl.callbacks.checkpoint import COMPLETE, list_checkpoints, read_header
from tests.conftest import runs_in, train_digits


@pytest.mark.slow
def test_a_failed_registration_keeps_the_checkpoints_and_the_rerun_only_registers(
    digits_table, tmp_path
):
    ckpts = tmp_path / "run" / "checkpoints"
    # A registry name MLflow refuses: training, evaluation and model logging succeed first.
    with pytest.raises(Exception, match=r"Invalid model name 'bad/name'"):
        train_digits(digits_table, tmp_path, "train.epochs=2", "tracking.registered_model=bad/name")
    assert not (ckpts / COMPLETE).exists()
    last = read_header(list_checkpoints(ckpts)[-1])
    assert last["training_done"] and last["epoch"] == 2
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (failed,) = runs_in(uri)
    assert failed.info.status == "FAILED"
    assert "Invalid model name" in failed.data.tags["keras_dl.failure"]

    _, result, _ = train_digits(digits_table, tmp_path, "train.epochs=2")
    assert result.history == {}  # no epoch trained again
    assert result.run_id == failed.info.run_id  # the same MLflow run, now FINISHED
    assert result.registered_version == 1
    assert (ckpts / COMPLETE).exists()
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    client = mlflow.MlflowClient(uri)
    assert len(client.get_metric_history(run.info.run_id, "test_accuracy")) == 1  # not redone
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]
    assert result.metrics["test_accuracy"] == run.data.metrics["test_accuracy"] > 0.5
