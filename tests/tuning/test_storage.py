"""requeue_stale on a real Optuna journal: what a killed driver left running runs again, once."""

from __future__ import annotations

from optuna.trial import TrialState

from keras_dl.tuning.storage import finished_trials, load_study, open_study, requeue_stale


def _study(tmp_path):
    return open_study(str(tmp_path / "s.journal"), "s", "minimize", seed=0, pruning=False)


def test_a_trial_left_running_is_failed_and_its_values_run_next(tmp_path):
    study = _study(tmp_path)
    done = study.ask()
    done.suggest_float("lr", 1e-3, 1e-1, log=True)
    study.tell(done, 0.5)
    killed = study.ask()  # the kill: chosen values, never told
    lr = killed.suggest_float("lr", 1e-3, 1e-1, log=True)
    units = killed.suggest_categorical("units", [32, 64])

    stale = requeue_stale(study)

    assert [t.number for t in stale] == [killed.number]
    again = load_study(str(tmp_path / "s.journal"), "s", seed=1, pruning=False)
    states = {t.number: t.state for t in again.get_trials(deepcopy=False)}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.FAIL, 2: TrialState.WAITING}
    nxt = again.ask()
    assert nxt.number == 2
    assert nxt.suggest_float("lr", 1e-3, 1e-1, log=True) == lr
    assert nxt.suggest_categorical("units", [32, 64]) == units
    assert [t.number for t in finished_trials(again)] == [0]


def test_a_trial_killed_before_choosing_values_is_failed_and_not_queued(tmp_path):
    study = _study(tmp_path)
    study.ask()  # the kill came between ask() and the first suggest: no values to run again
    partial = study.ask()
    lr = partial.suggest_float("lr", 1e-3, 1e-1, log=True)  # killed before the second value

    assert [t.number for t in requeue_stale(study)] == [0, 1]

    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.WAITING]
    assert trials[2].system_attrs["fixed_params"] == {"lr": lr}  # only the one it had
    assert requeue_stale(study) == []  # a second start finds nothing running


def test_nothing_running_queues_nothing(tmp_path):
    study = _study(tmp_path)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert requeue_stale(study) == []
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 0


def test_a_killed_trials_mlflow_run_ends_killed_even_before_the_trial_names_it(tmp_path):
    """The kill can come between a trial's run being created and the trial recording its id:
    the rerun finds that run by its parent and trial tag, and ends it KILLED."""
    import mlflow

    from keras_dl.config import Experiment, resolve
    from keras_dl.tracking import create_run
    from keras_dl.tuning.trial import RUN_ATTR, STATE_TAG, TRIAL_TAG, end_stale_runs
    from tests.conftest import seed_store

    uri = seed_store(tmp_path / "mlflow.db")
    exp = resolve(Experiment(recipe="digits"), sets=[f"tracking.uri={uri}", "data.table=/t"])
    parent = create_run(exp, {"mlflow.runName": "tune-s"})
    study = _study(tmp_path)
    named, unnamed = study.ask(), study.ask()
    runs = {}
    for trial in (named, unnamed):
        runs[trial.number] = create_run(
            exp, {"mlflow.parentRunId": parent, TRIAL_TAG: str(trial.number)}
        )
    named.set_user_attr(RUN_ATTR, runs[named.number])  # the other was killed before this
    other = create_run(exp, {"mlflow.parentRunId": parent, TRIAL_TAG: "7"})  # not stale

    end_stale_runs(exp, parent, requeue_stale(study))

    client = mlflow.MlflowClient(uri)
    for run_id in runs.values():
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags[STATE_TAG] == "killed"
    assert client.get_run(other).info.status == "RUNNING"
    assert client.get_run(parent).info.status == "RUNNING"


def test_a_retried_task_counts_its_ended_trials_and_reruns_only_its_dead_one(tmp_path):
    """A Spark task retried mid-share: the trials its failed attempt ended count against its
    share, and only its own RUNNING trial is failed and queued; another task's runs on."""
    from keras_dl.tuning.storage import TASK_ATTR, held_trials

    study = _study(tmp_path)
    ended = study.ask()
    ended.set_user_attr(TASK_ATTR, "f/0")
    ended.suggest_float("lr", 1e-3, 1e-1, log=True)
    study.tell(ended, 0.5)
    dead = study.ask()  # the attempt's worker crashed in this trial
    dead.set_user_attr(TASK_ATTR, "f/0")
    lr = dead.suggest_float("lr", 1e-3, 1e-1, log=True)
    other = study.ask()  # task 1 is still training this one
    other.set_user_attr(TASK_ATTR, "f/1")
    other.suggest_float("lr", 1e-3, 1e-1, log=True)

    done, running = held_trials(study, "f/0")
    assert [t.number for t in done] == [ended.number]
    assert [t.number for t in running] == [dead.number]
    assert [t.number for t in requeue_stale(study, held_by="f/0")] == [dead.number]

    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {
        0: TrialState.COMPLETE,
        1: TrialState.FAIL,
        2: TrialState.RUNNING,  # the other task's, untouched
        3: TrialState.WAITING,
    }
    assert study.get_trials(deepcopy=False)[3].system_attrs["fixed_params"] == {"lr": lr}
    assert held_trials(study, "f/1")[1][0].number == other.number
    assert held_trials(study, "g/0") == ([], [])  # another fan-out's task 0 holds nothing
