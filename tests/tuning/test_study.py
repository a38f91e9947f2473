"""``keras-dl tune`` on a real standalone Spark (two 1-core workers), SQLite MLflow, a Delta table:
two trials at a time as Spark tasks, the driver killed mid-study, then resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import HEAVY_IO, REPO
from tests.distribute.test_horovod_spark import standalone_cluster

# A kill -9 and a resume, like the recovery runs: one at a time, beside the Horovod queue.
pytestmark = HEAVY_IO

SPACE = ("train.learning_rate=loguniform(1e-3,3e-2)", "model.dense=choice(32,64)")


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory):
    with standalone_cluster(tmp_path_factory.mktemp("spark"), [(1, {}), (1, {})]) as cluster:
        yield cluster


def tune_command(table: str, tmp, trials: int, recipe: str = "digits", **sets: str) -> list[str]:
    """``keras-dl tune RECIPE``, 2 trials at a time, on SPACE; ``sets`` override settings
    (``train_epochs="1"`` sets ``train.epochs``)."""
    cmd = [sys.executable, "-m", "keras_dl.cli", "tune", recipe, "--trials", str(trials)]
    cmd += ["--parallelism", "2"]
    for dim in SPACE:
        cmd += ["--space", dim]
    for key, value in {
        "data.table": table,
        "tracking.uri": f"sqlite:///{tmp / 'mlflow.db'}",
        "runtime.run_dir": str(tmp / "run"),
        "train.epochs": "3",
        "train.verbose": "0",
        "callbacks.plots": "false",
        **{k.replace("_", ".", 1): v for k, v in sets.items()},
    }.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def _study(tmp):
    from keras_dl.tuning.storage import load_study

    return load_study(str(tmp / "optuna-digits.journal"), "digits", seed=0)


def _states(tmp) -> dict[int, str]:
    if not (tmp / "optuna-digits.journal").exists():
        return {}
    try:
        return {t.number: t.state.name for t in _study(tmp).get_trials(deepcopy=False)}
    except KeyError:  # the study is not created yet
        return {}


@pytest.mark.slow
def test_two_trials_at_a_time_on_spark_survive_a_driver_kill(spark_master, digits_table, tmp_path):
    import mlflow

    master, env = spark_master
    env = {**env, "MASTER": master}
    cmd = tune_command(digits_table, tmp_path, trials=4)
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 (closed below)
    driver = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline and driver.poll() is None:
            states = _states(tmp_path)
            if any(s in ("COMPLETE", "PRUNED") for s in states.values()):
                break
            time.sleep(1)
        assert driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its Spark JVM, mid-study
        driver.wait()
    finally:
        log.close()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    time.sleep(5)  # the orphaned Spark tasks end once their executors see the driver gone
    before = {t.number: t for t in _study(tmp_path).get_trials(deepcopy=False)}
    finished = {n: t for n, t in before.items() if t.state.name in ("COMPLETE", "PRUNED")}
    running = [n for n, t in before.items() if t.state.name == "RUNNING"]
    assert finished and running, {n: t.state.name for n, t in before.items()}
    # A trial asked in the instant before the kill may not have its process yet; every other
    # one has, and they name two Spark tasks, each training a trial at the same time.
    named = [t for t in before.values() if "process" in t.user_attrs]
    assert len(before) - len(named) <= 1, {n: t.user_attrs for n, t in before.items()}
    assert len({t.user_attrs["process"] for t in named}) == 2

    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    after = {t.number: t for t in _study(tmp_path).get_trials(deepcopy=False)}
    done = [t for t in after.values() if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == 4  # the budget counts the trials finished before the kill
    for number, trial in finished.items():  # not rerun: the same trial, value and MLflow run
        assert after[number].state == trial.state and after[number].value == trial.value
        assert after[number].user_attrs["mlflow_run_id"] == trial.user_attrs["mlflow_run_id"]
    # Left running by the kill: FAIL, their values queued again. A trial the kill caught between
    # study.ask() and choosing its values (the race allowed above) has none: a fresh trial runs.
    chosen = [n for n in running if after[n].params]
    assert len(running) - len(chosen) <= 1, {n: after[n].params for n in running}
    for number in running:
        assert after[number].state.name == "FAIL"
    for number in chosen:  # every value it had chosen (all, unless the kill came part-way)
        had = after[number].params.items()
        assert any(had <= t.params.items() for t in done if t.number > number)
    assert not [t for t in after.values() if t.state.name in ("RUNNING", "WAITING")]

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED" and parent.data.tags["keras_dl.tune.resumed"]
    states = sorted(r.data.tags.get("keras_dl.tune.state", "") for r in children)
    # Each running trial's MLflow run ended KILLED. A trial the kill caught between study.ask()
    # and creating its run (the race allowed above) has none: at most one such trial.
    by_trial: dict[str, list] = {}
    for r in children:
        by_trial.setdefault(r.data.tags["keras_dl.tune.trial"], []).append(r)
    killed = [r for n in running for r in by_trial.get(str(n), [])]
    assert sum(str(n) in by_trial for n in running) >= len(running) - 1, (running, by_trial)
    assert all(r.info.status == "KILLED" for r in killed), killed
    assert states.count("killed") == len(killed)
    assert set(states) <= {"killed", "complete", "pruned"}, states  # no run without its state
    assert len([s for s in states if s in ("complete", "pruned")]) == 4
    for child in children:
        if child.data.tags["keras_dl.tune.state"] in ("complete", "pruned"):
            assert "val_loss" in child.data.metrics  # per-epoch metrics of the trial
            assert "train.learning_rate" in child.data.params
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "study")}
    assert artifacts == {"study/trials.csv", "study/trials.html", "study/history.png"}
    best = parent.data.tags["keras_dl.tune.best_run_id"]
    assert best in {r.info.run_id for r in children}
    # The best trial's model went through the registry gate on its own run.
    assert "keras_dl.gate" in client.get_run(best).data.tags
    assert parent.data.tags["keras_dl.tune.registered"] == "digits/1"
    (version,) = client.search_model_versions("name='digits'")
    assert version.run_id == best
    assert "best trial" in proc.stdout
