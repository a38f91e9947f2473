"""The first slice end to end: Delta table -> Petastorm -> tf.data -> Keras -> MLflow."""

import mlflow
import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from tests.conftest import runs_in, train_digits


@pytest.fixture(scope="module")
def trained(digits_table, tmp_path_factory):
    """The digits recipe trained once with its default settings, tracked in a fresh store."""
    return train_digits(digits_table, tmp_path_factory.mktemp("train"), "callbacks.plots=true")


@pytest.mark.slow
def test_digits_reaches_the_accuracy_bar(trained):
    _, result, _ = trained
    assert result.metrics["test_accuracy"] >= 0.97


@pytest.mark.slow
def test_one_run_holds_config_metrics_tags_model_and_version(trained, digits_table):
    exp, result, uri = trained
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED" and run.info.run_id == result.run_id
    params = run.data.params
    assert params["train.batch_size"] == "32" and params["train.learning_rate"] == "0.001"
    assert params["data.table"] == digits_table and params["train.mixed_precision"] == "False"
    assert params["runtime.strategy"] == "auto" and params["tracking.registered_model"] == "digits"
    tags = run.data.tags
    assert tags["keras_dl.recipe"] == "digits"
    assert tags["data.table"] == digits_table and tags["data.version"] == "0"
    client = mlflow.MlflowClient(uri)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        history = client.get_metric_history(result.run_id, key)
        assert [m.step for m in history] == list(range(exp.train.epochs)), key
    assert run.data.metrics["test_accuracy"] == pytest.approx(result.metrics["test_accuracy"])
    (version,) = client.search_model_versions("name='digits'")
    assert int(version.version) == result.registered_version == 1
    assert version.run_id == result.run_id
    assert version.tags["data.table"] == digits_table and version.tags["data.version"] == "0"
    plots = sorted(a.path for a in client.list_artifacts(result.run_id, "plots"))
    assert plots == ["plots/confusion_matrix.png", "plots/curves.png"]


@pytest.mark.slow
def test_the_run_records_each_split_as_an_mlflow_dataset_and_the_model_an_input_example(
    trained, digits_table
):
    """Train, validation and test: the Delta table and version, the columns and the live rows."""
    import json

    from deltalake import DeltaTable

    exp, result, uri = trained
    counts = DeltaTable(digits_table).to_pandas()["split"].value_counts().to_dict()
    inputs = mlflow.MlflowClient(uri).get_run(result.run_id).inputs.dataset_inputs
    by_context = {
        next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs
    }
    assert set(by_context) == {"training", "validation", "test"}
    for context, split in (("training", "train"), ("validation", "validation"), ("test", "test")):
        dataset = by_context[context]
        assert dataset.source_type == "delta_table"
        # Version 0 is named too (MLflow's own source drops a falsy version).
        assert json.loads(dataset.source) == {"path": digits_table, "delta_table_version": 0}
        profile = json.loads(dataset.profile)
        assert profile["num_rows"] == counts[split], (split, profile)
        assert profile["version"] == 0 and profile["split"] == split
        schema = json.loads(dataset.schema)["mlflow_colspec"]
        assert [c["name"] for c in schema] == ["pixels", "label"], schema
    # The dataset entity loads back as MLflow's own Delta source.
    source = mlflow.data.get_source(inputs[0])
    assert source.path == digits_table and source.delta_table_version == 0
    # The logged model keeps two real rows of its input as its input_example.
    from mlflow.models import Model

    local = mlflow.artifacts.download_artifacts(result.model_uri, tracking_uri=uri)
    example = Model.load(local).load_input_example(local)
    pixels = np.stack(DeltaTable(digits_table).to_pandas()["pixels"])
    assert example.shape == (2, 64)
    assert all(np.isclose(pixels, row).all(axis=1).any() for row in example), example


@pytest.mark.slow
def test_registered_model_predicts_on_a_dataframe_of_raw_pixels(trained):
    _, result, uri = trained
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/digits/{result.registered_version}")
    assert str(model.metadata.signature.inputs.inputs[0].shape) == "(-1, 64)"
    digits = load_digits()
    frame = pd.DataFrame(digits.data[:200])  # raw 0-16 pixels, as pandas holds them (float64)
    probs = np.asarray(model.predict(frame))
    assert probs.shape == (200, 10)
    assert (probs.argmax(1) == digits.target[:200]).mean() >= 0.95
    # The same numbers as the in-process model.
    np.testing.assert_allclose(probs, result.model.predict(digits.data[:200], verbose=0), atol=1e-5)


@pytest.mark.slow
def test_resolved_config_is_saved_with_the_run(trained):
    exp, _, _ = trained
    from pathlib import Path

    import yaml

    saved = yaml.safe_load((Path(exp.runtime.run_dir) / "config.yaml").read_text())
    assert saved["train"]["epochs"] == exp.train.epochs and saved["recipe"] == "digits"


@pytest.mark.slow
def test_a_read_error_inside_fit_fails_the_run_as_the_reader_s_data_error(
    digits_table, tmp_path, monkeypatch
):
    from keras_dl.data.stream import epoch_stream
    from keras_dl.errors import DataError

    def broken(snapshot, columns, pieces, *args, **kwargs):
        piece = pieces[0]
        raise DataError(f"File {snapshot.files[piece.file]!r}, row group {piece.row_group}: bad")
        yield  # a generator, as the reader is: it fails inside tf.data

    monkeypatch.setattr(epoch_stream, "read_pieces", broken)
    with pytest.raises(DataError, match=r"File '.*\.parquet', row group \d+: bad"):
        train_digits(digits_table, tmp_path, "train.epochs=1")
    (run,) = runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"].startswith("DataError: File '")


@pytest.mark.slow
def test_a_filtered_run_logs_rows_scanned_beside_rows_kept(digits_table, tmp_path):
    """A filter on a data column: each split's rows scanned and kept, files and row groups
    skipped, as run params; the rows kept are the rows the filter keeps."""
    from keras_dl.data import read_table

    _, result, uri = train_digits(
        digits_table, tmp_path, "data.filters=label >= 5", "train.epochs=1"
    )
    (run,) = runs_in(uri)
    params = run.data.params
    kept = read_table(digits_table, columns=["label"], filters=["split = train", "label >= 5"])
    assert int(params["data.train.rows_kept"]) == kept.num_rows == int(params["data.train_rows"])
    assert int(params["data.train.rows_scanned"]) >= kept.num_rows
    for split in ("train", "validation"):
        assert int(params[f"data.{split}.files_skipped"]) >= 0
        assert int(params[f"data.{split}.row_groups_skipped"]) >= 0
