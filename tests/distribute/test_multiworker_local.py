"""runtime.strategy=multiworker with np=-2 on this host: two real TF workers (TF_CONFIG on
loopback) training the digits recipe through keras_dl's fit, launched by the driver."""

from __future__ import annotations

import functools
import json

import mlflow
import pytest

from keras_dl.callbacks.checkpoint import list_checkpoints, read_header
from keras_dl.errors import Preempted
from keras_dl.launch import launch
from tests.conftest import HEAVY, runs_in
from tests.distribute.workers import op_before_the_strategy, train_and_report_to, train_with_fault

pytestmark = HEAVY  # see tests/conftest.py

TRAIN_ROWS = 1257  # the digits table's training split
# 629 and 628 rows per worker at 64 a step (global batch 128): 10 steps, the last one padded.
STEPS = 10


@pytest.mark.slow
def test_two_workers_train_every_row_once_and_the_driver_logs_one_run(digits_exp, tmp_path):
    exp = digits_exp(
        "runtime.strategy=multiworker", "runtime.np=-2", "train.epochs=2", "train.batch_size=128"
    )
    result = launch(exp, main=functools.partial(train_and_report_to, folder=str(tmp_path)))
    reports = [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["size"]) for r in reports] == [(0, 2), (1, 2)]
    assert reports[0]["digest"] == reports[1]["digest"]  # bit-identical weights
    assert reports[0]["start_digest"] == reports[1]["start_digest"]  # worker 0's, broadcast
    for epoch in range(2):
        logs = [r["epochs"][epoch]["logs"] for r in reports]
        for key in ("loss", "accuracy", "rows_trained"):  # not each worker's own timings
            assert logs[0][key] == logs[1][key]  # early stopping and checkpoints decide alike
        assert logs[0]["rows_trained"] == TRAIN_ROWS  # every row once, padding not counted
    (run,) = runs_in(exp.tracking.uri)  # one run, the driver's, ended by worker 0
    assert run.info.run_id == result.run_id and run.info.status == "FINISHED"
    assert run.data.params["runtime.np"] == "-2"
    client = mlflow.MlflowClient(exp.tracking.uri)
    logged = [m.value for m in client.get_metric_history(result.run_id, "loss")]
    assert logged == pytest.approx([e["logs"]["loss"] for e in reports[0]["epochs"]], rel=1e-6)
    (version,) = client.search_model_versions(f"name='{exp.tracking.registered_model}'")
    assert version.run_id == result.run_id and result.registered_version == int(version.version)
    assert result.metrics["test_accuracy"] > 0.15  # learned (chance: 0.1) in 20 steps of 128
    last = read_header(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    assert last["global_step"] == 2 * STEPS and last["world_size"] == 2


@pytest.mark.slow
def test_a_preempted_worker_stops_both_and_a_rerun_resumes_in_the_same_run(digits_exp, tmp_path):
    exp = digits_exp(
        "runtime.strategy=multiworker",
        "runtime.np=-2",
        "train.epochs=2",
        "train.batch_size=128",
        "tracking.log_model=false",
    )
    main = functools.partial(
        train_with_fault, mode="sigterm", rank=1, epoch=1, batch=1, stamp=str(tmp_path / "s")
    )
    with pytest.raises(Preempted, match=r"Preempted by SIGTERM: stopped after step"):
        launch(exp, main=main)
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "KILLED" and run.data.tags["preempted"] == "SIGTERM"
    last = read_header(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    assert last["epoch"] == 1 and 0 < last["step"] < STEPS  # mid-epoch 2, on both workers
    history = launch(exp, main=functools.partial(train_with_fault, mode="none", rank=9))
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FINISHED"
    assert len(history["loss"]) == 1  # the rerun trained only the rest of epoch 2
    rows = mlflow.MlflowClient(exp.tracking.uri).get_metric_history(run.info.run_id, "rows_trained")
    assert sorted((m.step, m.value) for m in rows) == [(0, TRAIN_ROWS), (1, TRAIN_ROWS)]


@pytest.mark.slow
def test_two_workers_of_a_mixed_split_log_each_sources_rows_summed_over_both(
    digits_exp, digits_table
):
    """The per-source counts were gathered with Horovod's allgather, which is not initialized
    under the multi-worker strategy: the first epoch's end failed."""
    from tests.run.test_mixed_fit import SOURCES

    exp = digits_exp(
        SOURCES.replace("TABLE", digits_table),
        "runtime.strategy=multiworker",
        "runtime.np=-2",
        "train.epochs=1",
        "train.batch_size=128",
        "data.epoch_rows=1000",
        "tracking.log_model=false",
    )
    result = launch(exp)
    metrics = mlflow.MlflowClient(exp.tracking.uri).get_run(result.run_id).data.metrics
    assert (metrics["rows_trained/low"], metrics["rows_trained/high"]) == (700, 300)
    assert metrics["rows_trained"] == 1000  # each source's share once, over both workers


@pytest.mark.slow
def test_a_worker_main_that_runs_an_op_before_the_strategy_is_told_to_create_it_first(digits_exp):
    """TF said only "Collective ops must be configured at program startup"."""
    from keras_dl.errors import ConfigError

    exp = digits_exp("runtime.strategy=multiworker", "runtime.np=-2")
    with pytest.raises(ConfigError, match=r"TensorFlow already ran an op") as caught:
        launch(exp, main=op_before_the_strategy)
    assert "multiworker.init()" in str(caught.value) and "before loading a model" in str(
        caught.value
    )
