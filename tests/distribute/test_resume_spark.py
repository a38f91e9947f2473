"""A HorovodRunner job on the standalone loopback cluster, stopped mid-epoch on 2 Spark tasks,
resumes on 1 task with every epoch's rows trained once.

Its own module, so it has its own cluster: after the other module's Spark Connect server stops,
the master can keep counting that application's cores for a while (0 free slots)."""

from __future__ import annotations

import pytest

from tests.conftest import SPARK_CLUSTER
from tests.distribute.test_horovod_spark import _run_driver, standalone_cluster

pytestmark = SPARK_CLUSTER  # see tests/conftest.py
EPOCHS = 4  # the multi-worker test's (tests/distribute/multiworker_resume_driver.py)


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """``spark://127.0.0.1:PORT``: a standalone master and two 1-core workers, stopped after."""
    with standalone_cluster(tmp_path_factory.mktemp("spark"), [(1, {}), (1, {})]) as cluster:
        yield cluster


@pytest.mark.slow
def test_a_two_task_job_stopped_mid_epoch_resumes_on_one_task_training_every_row_once(
    spark_cluster, digits_table, tmp_path
):
    from tests.conftest import rows_trained_history, runs_in

    master, env = spark_cluster
    out, logs = _run_driver(
        env, master, digits_table, str(tmp_path), module="tests.distribute.spark_resume_driver"
    )
    assert out["first"].startswith("preempted at "), logs[-3000:]
    assert "on 1 rank(s) (checkpoint written on 2)" in logs
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (run,) = runs_in(uri)
    assert run.info.run_id == out["run_id"] and run.info.status == "FINISHED"
    rows = int(run.data.params["data.train_rows"])
    trained = rows_trained_history(uri, run)
    assert trained == [(e, rows) for e in range(3)]  # every epoch once, every row once


@pytest.mark.slow
def test_a_multiworker_job_preempted_by_a_worker_then_the_driver_resumes_on_one_task(
    spark_cluster, digits_table, tmp_path
):
    """runtime.strategy=multiworker on 2 Spark tasks: SIGTERM to worker 1 mid-epoch 2, then
    SIGTERM to the driver (its workers are told through the run folder's rank-output), each
    end the job as a preemption (checkpoint, exit 75's error); a rerun on 1 task finishes the
    same run, every epoch's rows once."""
    from tests.conftest import rows_trained_history, runs_in

    master, env = spark_cluster
    out, logs = _run_driver(
        env,
        master,
        digits_table,
        str(tmp_path),
        module="tests.distribute.multiworker_resume_driver",
    )
    print(out)
    assert out["worker"].startswith("preempted by SIGTERM at "), logs[-3000:]
    assert out["driver"].startswith("preempted by SIGTERM at "), logs[-3000:]
    assert "SIGTERM: asking every worker to checkpoint and stop" in logs, logs[-3000:]
    assert out["rerun"] == "finished"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    rows = int(run.data.params["data.train_rows"])
    trained = rows_trained_history(uri, run)
    assert trained == [(e, rows) for e in range(EPOCHS)]  # every epoch once, every row once
