"""``keras-dl tune`` whose Spark task Spark retries: a local Spark that allows a task two
attempts (``local[2,2]``), SQLite MLflow, a Delta table, 3 trials 2 at a time (task 0's share
is 2). Task 0's first attempt ends its first trial, then its Python worker dies in the
second; the retry runs only that trial's values again. Before, it ran its whole share again:
one trial over the budget, and the dead attempt's trial left RUNNING for good."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REPO
from tests.tuning.crash_once_recipe import MARKER
from tests.tuning.test_study import _study, tune_command

RECIPE = "tests.tuning.crash_once_recipe"


@pytest.mark.slow
def test_a_retried_task_reruns_only_its_dead_trial_and_the_study_keeps_its_budget(
    digits_table, tmp_path
):
    import mlflow

    # The study and experiment named as digits' (_study reads optuna-digits.journal).
    cmd = tune_command(
        digits_table,
        tmp_path,
        3,
        RECIPE,
        tracking_experiment="digits",
        tune_study="digits",
        train_epochs="1",
    )
    marker = tmp_path / "crashed"
    env = {**os.environ, "MASTER": "local[2,2]", MARKER: str(marker)}

    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)

    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    assert marker.exists(), out  # task 0's first attempt did lose its worker
    trials = {t.number: t for t in _study(tmp_path).get_trials(deepcopy=False)}
    states = {n: t.state.name for n, t in trials.items()}
    done = [t for t in trials.values() if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == 3, states  # the budget, not one over
    [dead] = [t for t in trials.values() if t.state.name == "FAIL"]
    assert dead.user_attrs["spark_task"].endswith("/0"), dead.user_attrs
    assert not [s for s in states.values() if s in ("RUNNING", "WAITING")], states
    # The dead trial's values ran again, in a trial after it.
    assert any(dead.params.items() <= t.params.items() for t in done if t.number > dead.number)
    # Task 0 ended 2 trials in all, across its two attempts; task 1 ended its 1.
    by_task = sorted(t.user_attrs["spark_task"][-1] for t in done)
    assert by_task == ["0", "0", "1"], by_task

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    trial_runs = {}
    for r in runs:
        if "keras_dl.tune.trial" in r.data.tags:
            trial_runs.setdefault(int(r.data.tags["keras_dl.tune.trial"]), []).append(r)
    [killed] = trial_runs[dead.number]  # the dead attempt's run: ended, not left RUNNING
    assert killed.info.status == "KILLED" and killed.data.tags["keras_dl.tune.state"] == "killed"
    finished = [r for t in done for r in trial_runs[t.number]]
    assert len(finished) == 3 and all(r.info.status == "FINISHED" for r in finished), finished
