"""RunTensorBoard: TensorBoard logs and a profiler trace in the run, one writer beside autolog."""

from __future__ import annotations

import os

import mlflow
import pytest

from keras_dl.callbacks.tensorboard import RunTensorBoard
from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from tests.callbacks.helpers import tiny_data, tiny_model
from tests.conftest import runs_in


def _artifacts(uri: str, run_id: str, path: str = "tensorboard_logs") -> list[str]:
    """Every file under ``path`` in the run's artifacts."""
    client = mlflow.MlflowClient(uri)
    out = []
    for item in client.list_artifacts(run_id, path):
        out += _artifacts(uri, run_id, item.path) if item.is_dir else [item.path]
    return out


def test_logs_and_the_profiled_steps_are_uploaded_and_the_temporary_folder_removed(mlflow_uri):
    x, y = tiny_data(rows=256)
    tb = RunTensorBoard(profile_steps=(3, 5))
    with mlflow.start_run() as run:
        tiny_model().fit(
            x, y, epochs=2, batch_size=16, verbose=0, validation_split=0.25, callbacks=[tb]
        )
    files = _artifacts(mlflow_uri, run.info.run_id)
    assert tb.uploaded and not os.path.exists(tb.log_dir)
    assert [f for f in files if f.startswith("tensorboard_logs/train/events.out.tfevents")]
    assert [f for f in files if f.startswith("tensorboard_logs/validation/events.out.tfevents")]
    # TensorFlow's profiler trace of steps 3-5 (TensorBoard's Profile tab reads it).
    assert [f for f in files if f.endswith(".xplane.pb") and "/plugins/profile/" in f], files


def test_beside_tensorflow_autolog_there_is_one_writer(mlflow_uri, tmp_path):
    x, y = tiny_data(rows=256)
    tb = RunTensorBoard(log_dir=str(tmp_path / "tb"), profile_steps=(2, 3))
    mlflow.tensorflow.autolog(log_models=False)
    try:
        tiny_model().fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[tb])
    finally:
        mlflow.tensorflow.autolog(disable=True)
    (run,) = runs_in(mlflow_uri)
    assert not tb.uploaded  # autolog uploaded the folder itself
    files = _artifacts(mlflow_uri, run.info.run_id)
    events = [f for f in files if "events.out.tfevents" in f]
    # Autolog used this callback's folder (the profile trace is only this callback's) and
    # added no TensorBoard writer of its own: one events file for training.
    assert len(events) == 1 and events[0].startswith("tensorboard_logs/train/"), files
    assert [f for f in files if f.endswith(".xplane.pb")], files


@pytest.mark.parametrize("steps", ["5,3", "0,2", "4"])
def test_bad_profile_steps_are_a_named_error(steps):
    with pytest.raises(ConfigError, match=r"runtime\.profile_steps=.*START,END"):
        resolve(
            load_recipe("digits").defaults,
            sets=["data.table=t", f"runtime.profile_steps={steps}"],
        )


@pytest.mark.slow
def test_keras_dl_fit_uploads_tensorboard_logs_and_a_trace_to_its_run(digits_table, tmp_path):
    from keras_dl.train import fit

    exp = resolve(
        load_recipe("digits").defaults,
        sets=[
            f"data.table={digits_table}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "train.epochs=2",
            "train.verbose=0",
            "tracking.log_model=false",
            "tracking.tensorboard=true",
            "runtime.profile_steps=2,4",
        ],
    )
    result = fit(exp)
    files = _artifacts(exp.tracking.uri, result.run_id)
    assert [f for f in files if f.startswith("tensorboard_logs/train/events.out.tfevents")]
    assert [f for f in files if f.endswith(".xplane.pb")], files
