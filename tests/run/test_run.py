"""One training run from open to end: the folder's files, the lock, and the MLflow run's life
(created or attached, its config artifact and tags, its end status), for ``fit`` on the chief,
on another rank, and for a launcher's driver. Real SQLite MLflow, real folders on disk."""

from __future__ import annotations

import mlflow
import pytest
import yaml

from keras_dl.config import resolve
from keras_dl.distribute.world import World
from keras_dl.errors import DataError, DivergenceError, Preempted
from keras_dl.recipe import load_recipe
from keras_dl.run import CONFIG_FILE, RUN_FILE, RunFolder, open_run
from keras_dl.runlock import RunLockedError


def _exp(tmp_path, mlflow_uri, *sets):
    recipe = load_recipe("digits")
    base = [
        f"data.table={tmp_path / 'table'}",
        f"runtime.run_dir={tmp_path / 'run'}",
        f"tracking.uri={mlflow_uri}",
    ]
    return resolve(recipe.defaults, sets=[*base, *sets])


def _run(mlflow_uri, run_id):
    return mlflow.MlflowClient(mlflow_uri).get_run(run_id)


def _artifacts(mlflow_uri, run_id):
    return [a.path for a in mlflow.MlflowClient(mlflow_uri).list_artifacts(run_id)]


def test_a_run_records_its_folder_and_ends_finished(tmp_path, mlflow_uri):
    exp = _exp(tmp_path, mlflow_uri, "train.epochs=7")
    with open_run(exp, World()) as run:
        run_id = run.start(tags={"delta.version": "3"})
        assert mlflow.active_run().info.run_id == run_id
    folder = RunFolder(tmp_path / "run")
    assert folder.recorded_run_id() == run_id
    assert folder.store.read_json(RUN_FILE)["tracking_uri"] == mlflow_uri
    assert yaml.safe_load(folder.store.read_text(CONFIG_FILE))["train"]["epochs"] == 7
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "FINISHED" and mlflow.active_run() is None
    assert got.data.params["train.epochs"] == "7"
    assert got.data.tags["delta.version"] == "3" and got.data.tags["keras_dl.recipe"] == "digits"
    assert CONFIG_FILE in _artifacts(mlflow_uri, run_id)


def test_an_error_ends_the_run_failed_with_its_cause_and_frees_the_folder(tmp_path, mlflow_uri):
    exp = _exp(tmp_path, mlflow_uri)
    with pytest.raises(DataError), open_run(exp, World()) as run:
        run_id = run.start()
        raise DataError("table /t: file part-0.parquet is missing")
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "FAILED"
    assert (
        got.data.tags["keras_dl.failure"] == "DataError: table /t: file part-0.parquet is missing"
    )
    with open_run(exp, World()) as again:  # the lock was released
        assert again.start() != run_id  # no checkpoint: nothing to resume, a new run


def test_a_preempted_run_ends_killed_with_the_signal(tmp_path, mlflow_uri):
    exp = _exp(tmp_path, mlflow_uri)
    with pytest.raises(Preempted), open_run(exp, World()) as run:
        run_id = run.start()
        raise Preempted("SIGTERM", 12)
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "KILLED" and got.data.tags["preempted"] == "SIGTERM"
    assert got.data.tags["keras_dl.failure"].startswith("Preempted: Preempted by SIGTERM")


def test_an_error_before_the_run_starts_leaves_no_mlflow_run(tmp_path, mlflow_uri):
    exp = _exp(tmp_path, mlflow_uri)
    with pytest.raises(DataError), open_run(exp, World()):
        raise DataError("the table cannot be read")  # e.g. while reading the splits
    assert mlflow.search_runs(search_all_experiments=True).empty


def test_a_second_run_in_a_held_folder_is_refused_naming_the_holder(tmp_path, mlflow_uri):
    exp = _exp(tmp_path, mlflow_uri)
    with open_run(exp, World()) as run:
        run.start()
        with pytest.raises(RunLockedError, match=run.run_id), open_run(exp, World()):
            pass


def test_another_rank_writes_nothing_and_ends_nothing(tmp_path, mlflow_uri):
    exp = _exp(tmp_path, mlflow_uri)
    with open_run(exp, World(rank=1, size=2)) as run:
        assert run.start() is None
    assert not (tmp_path / "run").exists()
    assert mlflow.search_runs(search_all_experiments=True).empty


def test_a_driver_creates_the_run_with_its_config_and_leaves_the_finish_to_rank_0(
    tmp_path, mlflow_uri
):
    exp = _exp(tmp_path, mlflow_uri)
    with open_run(exp, World(), lock_run_dir=True, driver=True) as run:
        run_id = run.start({"keras_dl.np": "-2"})
        assert mlflow.active_run() is None  # created for the ranks, not activated here
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "RUNNING"  # rank 0 attaches and ends it
    assert got.data.tags["keras_dl.np"] == "-2" and "train.epochs" in got.data.params
    assert CONFIG_FILE in _artifacts(mlflow_uri, run_id)
    assert RunFolder(tmp_path / "run").recorded_run_id() == run_id
    with pytest.raises(RuntimeError), open_run(exp, World(), run_id=run_id, driver=True) as again:
        assert again.start() == run_id  # attached, not created again
        raise RuntimeError("rank 1 died")
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "FAILED"
    assert got.data.tags["keras_dl.failure"] == "RuntimeError: rank 1 died"


@pytest.mark.parametrize(
    "error, stale",
    [
        (Preempted("SIGTERM", 12), {"preempted", "keras_dl.failure"}),
        (
            DivergenceError("Training diverged: loss nan"),
            {"keras_dl.failure", "keras_dl.failure_reason"},
        ),
    ],
    ids=["preempted", "diverged"],
)
def test_a_resumed_run_that_finishes_loses_the_failure_tags_of_the_attempt_before(
    tmp_path, mlflow_uri, error, stale
):
    exp = _exp(tmp_path, mlflow_uri)
    with pytest.raises(type(error)), open_run(exp, World()) as run:
        run_id = run.start()
        raise error
    assert stale <= set(_run(mlflow_uri, run_id).data.tags)  # the first attempt's end
    with open_run(exp, World(), run_id=run_id) as again:  # the rerun continues the same run
        assert again.start() == run_id
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "FINISHED"
    assert not stale & set(got.data.tags), got.data.tags
    assert got.data.tags["keras_dl.recipe"] == "digits"  # other tags stay


def test_a_launched_run_finished_by_its_driver_loses_the_failure_tags(tmp_path, mlflow_uri):
    from keras_dl.tracking import terminate_run

    exp = _exp(tmp_path, mlflow_uri)
    with pytest.raises(RuntimeError), open_run(exp, World(), lock_run_dir=True, driver=True) as run:
        run_id = run.start()
        raise RuntimeError("rank 1 died")
    terminate_run(mlflow_uri, run_id, "FINISHED")
    got = _run(mlflow_uri, run_id)
    assert got.info.status == "FINISHED" and "keras_dl.failure" not in got.data.tags


def test_a_launched_rank_cut_off_the_tracking_server_leaves_a_failure_to_its_driver(
    tmp_path, mlflow_uri, monkeypatch
):
    """Rank 0 whose host lost the tracking server (MLflow would retry for minutes) does not end
    the run: its driver ends it with the job's error. A rank that reaches it ends it itself."""
    import keras_dl.run.run as run_module
    from keras_dl.errors import StoreUnavailable
    from keras_dl.runlock import HELD_BY_LAUNCHER, launcher_key
    from keras_dl.tracking import create_run

    exp = _exp(tmp_path, mlflow_uri)
    monkeypatch.setenv(HELD_BY_LAUNCHER, launcher_key(exp.runtime.run_dir))
    for answers, status in ((False, "RUNNING"), (True, "KILLED")):
        monkeypatch.setattr(run_module, "_answers", lambda uri, answers=answers: answers)
        run_id = create_run(exp, {})
        with pytest.raises(StoreUnavailable), open_run(exp, World(), run_id=run_id) as run:
            run.start()
            raise StoreUnavailable("s3://lake", 16.0)
        assert _run(mlflow_uri, run_id).info.status == status
        mlflow.end_run()  # what the rank left active, as its process would end
