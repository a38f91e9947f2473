"""The pruning callback in a real ``model.fit`` against a real Optuna study, and a study run in
this process through ``keras_dl.tune`` (parallelism 1), resumed without rerunning a trial."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from keras_dl.tuning.pruning import OptunaPruning, direction_of
from tests.conftest import HEAVY


def _fit(trial, monitor="val_loss", epochs=4):
    import keras

    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy")
    cb = OptunaPruning(trial, monitor)
    history = model.fit(x, y, validation_split=0.25, epochs=epochs, verbose=0, callbacks=[cb])
    return cb, history


def test_a_pruned_trial_stops_training_after_the_epoch_it_is_pruned():
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.0))  # prune all
    trial = study.ask()
    cb, history = _fit(trial)
    assert cb.pruned_epoch == 0 and len(history.history["loss"]) == 1
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {0: cb.last_value}


def test_an_unpruned_trial_reports_every_epoch():
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    trial = study.ask()
    cb, history = _fit(trial, epochs=3)
    assert cb.pruned_epoch is None and len(history.history["loss"]) == 3
    reported = trial.storage.get_trial(trial._trial_id).intermediate_values
    assert reported == {i: pytest.approx(v) for i, v in enumerate(history.history["val_loss"])}


def test_a_metric_the_logs_lack_is_named():
    trial = optuna.create_study().ask()
    with pytest.raises(ValueError, match="no 'val_accuracy'.*tune.metric"):
        _fit(trial, monitor="val_accuracy")


def test_direction_follows_the_metric_name():
    assert direction_of("val_loss") == "minimize"
    assert direction_of("val_accuracy") == "maximize"
    assert direction_of("val_accuracy", "minimize") == "minimize"


@pytest.mark.slow
def test_a_study_in_this_process_has_a_parent_run_and_resumes(digits_table, tmp_path, mlflow_uri):
    import mlflow

    import keras_dl
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe

    sets = [
        f"data.table={digits_table}",
        f"tracking.uri={mlflow_uri}",
        f"runtime.run_dir={tmp_path / 'run'}",
        "train.epochs=2",
        "train.verbose=0",
        "callbacks.plots=false",
        "tune.trials=2",
        "tracking.registered_model=none",
    ]
    exp = resolve(load_recipe("digits").defaults, sets=sets)
    space = ["train.learning_rate=loguniform(1e-3,1e-2)", "model.dense=choice(32,64)"]
    first = keras_dl.tune(exp, space)
    assert [r["state"] for r in first.trials] == ["complete", "complete"]
    assert (tmp_path / "optuna-digits.journal").exists()  # beside mlflow.db
    client = mlflow.MlflowClient(mlflow_uri)
    children = client.search_runs(
        [client.get_experiment_by_name("digits").experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{first.parent_run_id}'",
    )
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    assert first.best_run_id in {c.info.run_id for c in children}
    assert first.registered_version is None  # tracking.registered_model=none

    again = keras_dl.tune(exp, space)  # the budget is spent: nothing runs again
    assert again.parent_run_id == first.parent_run_id
    assert [r["run_id"] for r in again.trials] == [r["run_id"] for r in first.trials]
    assert mlflow.active_run() is None


@HEAVY
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["horovod", "multiworker"])
def test_a_trial_may_itself_run_on_horovod_ranks_or_multiworker_workers(
    digits_table, tmp_path, mlflow_uri, capfd, monkeypatch, strategy
):
    """A multi-worker trial ran ``fit`` in the tuning process instead of launching workers."""
    import mlflow

    # Fresh rank processes (tests/warm_python.py): rank 1 prints only what its imports print,
    # and that output, streamed back with its "[1]<" prefix, is what the end of the test checks.
    monkeypatch.setenv("KERAS_DL_COLD_PYTHON", "1")

    import keras_dl
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe

    sets = [
        f"data.table={digits_table}",
        f"tracking.uri={mlflow_uri}",
        f"runtime.run_dir={tmp_path / 'run'}",
        "train.epochs=1",
        "train.verbose=0",
        "callbacks.plots=false",
        f"runtime.strategy={strategy}",
        "runtime.np=-2",
        "tune.trials=1",
        "tracking.registered_model=none",
    ]
    exp = resolve(load_recipe("digits").defaults, sets=sets)
    result = keras_dl.tune(exp, ["train.learning_rate=loguniform(1e-3,1e-2)"])
    (row,) = result.trials
    assert row["state"] == "complete" and row["value"] > 0  # scored on rank 0's last epoch
    child = mlflow.MlflowClient(mlflow_uri).get_run(row["run_id"])
    assert child.data.tags["mlflow.parentRunId"] == result.parent_run_id
    assert child.data.params["runtime.np"] == "-2" and child.info.status == "FINISHED"
    out, err = capfd.readouterr()
    assert "[1]<" in out + err  # rank 1's output, streamed back by the launcher


def test_a_second_driver_of_the_same_study_is_refused(digits_table, tmp_path, mlflow_uri):
    import keras_dl
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.runlock import RunLockedError, open_run_lock

    sets = [f"data.table={digits_table}", f"runtime.run_dir={tmp_path / 'run'}"]
    exp = resolve(load_recipe("digits").defaults, sets=[*sets, f"tracking.uri={mlflow_uri}"])
    held = open_run_lock(tmp_path / "run" / "tune" / "digits")
    held.acquire()  # a driver of study "digits" that is running
    try:
        with pytest.raises(RunLockedError):
            keras_dl.tune(exp, ["train.learning_rate=loguniform(1e-3,1e-2)"])
    finally:
        held.release()
    assert not (tmp_path / "optuna-digits.journal").exists()  # refused before the study opened
