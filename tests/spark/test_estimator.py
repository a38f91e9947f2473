"""KerasEstimator in a Spark ML Pipeline on iris: it learns, its output is Spark ML's, it saves and
loads, and each fit is one MLflow run of the one training path, on a Delta table under store."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator, RegressionEvaluator
from pyspark.ml.feature import StandardScaler, VectorAssembler

from keras_dl.spark import KerasEstimator, KerasModel
from tests.conftest import HEAVY
from tests.spark.conftest import make_model

pytestmark = pytest.mark.slow  # one fit of EPOCHS epochs shared by the module

# Enough for iris: in plain Keras, 8 epochs of this model already score 0.92-0.95 on its 150
# rows (4 random validation splits, features scaled as here).
EPOCHS = 15


def _pipeline(store, **params):
    import keras

    settings = dict(
        model=make_model(),
        optimizer=keras.optimizers.Adam(0.02),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        feature_cols=["scaled"],
        label_cols=["label"],
        validation=0.2,
        batch_size=16,
        epochs=EPOCHS,
        store=str(store),
        experiment=["callbacks.plots=false"],
    )
    settings.update(params)
    return Pipeline(
        stages=[
            VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled"),
            KerasEstimator(**settings),
        ]
    )


@pytest.fixture(scope="module")
def fitted(iris, tmp_path_factory):
    """The iris pipeline fitted once, tracked in its own SQLite store."""
    import os

    tmp = tmp_path_factory.mktemp("iris")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        model = _pipeline(tmp / "store", registered_model="iris").fit(iris)
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    assert mlflow.active_run() is None
    return model, uri, tmp


@pytest.mark.connect_too
def test_iris_pipeline_learns_and_scores_as_spark_ml(fitted, iris):
    model, _, _ = fitted
    out = model.transform(iris)
    schema = {f.name: f.dataType.simpleString() for f in out.schema.fields}
    assert schema["prediction"] == "double" and schema["probability"] == "vector"
    assert list(out.columns)[:8] == ["sl", "sw", "pl", "pw", "label", "id", "raw", "scaled"]
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    print(f"iris accuracy (train rows, {EPOCHS} epochs): {accuracy:.4f}")
    assert accuracy >= 0.9
    rows = out.select("probability").toPandas()["probability"]
    probs = np.stack([v.toArray() for v in rows])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    # The same numbers as the keras.Model in this process.
    keras_model = model.stages[-1]
    assert isinstance(keras_model, KerasModel)
    scaled = np.stack([v.toArray() for v in out.sort("id").select("scaled").toPandas()["scaled"]])
    expected = keras_model.getModel().predict(scaled.astype("float32"), verbose=0)
    got = np.stack(
        [v.toArray() for v in out.sort("id").select("probability").toPandas()["probability"]]
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.connect_too
def test_fit_is_one_tracked_run_on_a_delta_table_under_store(fitted):
    from deltalake import DeltaTable

    model, uri, tmp = fitted
    run_id = model.stages[-1].getRunId()
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["keras_dl.recipe"] == "keras_estimator"
    table = run.data.tags["data.table"]
    assert table.startswith(str(tmp / "store" / "data")) and run.data.tags["data.version"] == "0"
    assert DeltaTable(table).to_pyarrow_table().num_rows == 150
    assert (
        run.data.params["train.epochs"] == str(EPOCHS)
        and run.data.params["train.batch_size"] == "16"
    )
    history = mlflow.MlflowClient(uri).get_metric_history(run_id, "val_accuracy")
    assert len(history) == EPOCHS
    version = mlflow.MlflowClient(uri).get_model_version("iris", "1")
    assert version.run_id == run_id
    assert list((tmp / "store" / "runs").glob("*/checkpoints/*"))


@pytest.mark.connect_too
def test_save_and_load_give_identical_predictions(fitted, iris, tmp_path):
    model, _, _ = fitted
    before = model.transform(iris).sort("id").select("prediction", "probability").toPandas()
    model.save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    after = loaded.transform(iris).sort("id").select("prediction", "probability").toPandas()
    np.testing.assert_array_equal(before["prediction"], after["prediction"])
    np.testing.assert_array_equal(
        np.stack([v.toArray() for v in before["probability"]]),
        np.stack([v.toArray() for v in after["probability"]]),
    )
    keras_model = model.stages[-1]
    keras_model.save(str(tmp_path / "keras_model"))
    alone = KerasModel.load(str(tmp_path / "keras_model"))
    assert alone.getRunId() == keras_model.getRunId() and alone.uid == keras_model.uid
    scaled = model.stages[1].transform(model.stages[0].transform(iris))
    again = alone.transform(scaled).sort("id").select("prediction").toPandas()
    np.testing.assert_array_equal(before["prediction"], again["prediction"])


def test_output_column_names(fitted, iris):
    model, _, _ = fitted
    scaled = model.stages[1].transform(model.stages[0].transform(iris))
    keras_model = model.stages[-1].copy()
    out = keras_model.setPredictionCol("cls").setProbabilityCol("p").transform(scaled)
    assert out.columns[-2:] == ["cls", "p"]
    out = keras_model.setOutputCols(["a", "b"]).transform(scaled)
    assert out.columns[-2:] == ["a", "b"]
    assert model.stages[-1].getOutputCols() == ["prediction", "probability"]  # copy untouched
    evaluator = MulticlassClassificationEvaluator(predictionCol="a", metricName="f1")
    assert evaluator.evaluate(out) > 0.85


def test_regression_output_works_with_regression_evaluator(spark, tmp_path, mlflow_uri):
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    frame = pd.DataFrame({"x": list(x), "y": x @ np.array([1.0, -2.0, 0.5]) + 0.3})
    df = spark.createDataFrame(frame)  # an array<double> feature column
    est = KerasEstimator(
        model=make_model(3, 1, activation="linear"),
        optimizer="adam",
        loss="mse",
        feature_cols=["x"],
        label_cols="y",
        batch_size=20,
        epochs=2,
        store=str(tmp_path / "store"),
        experiment=["callbacks.plots=false", "train.learning_rate=0.05"],
    )
    model = est.fit(df)
    out = model.transform(df)
    assert (
        "probability" not in out.columns
        and out.schema["prediction"].dataType.simpleString() == "double"
    )
    rmse = RegressionEvaluator(labelCol="y").evaluate(out)
    assert np.isfinite(rmse)
    run = mlflow.MlflowClient(mlflow_uri).get_run(model.getRunId())
    assert run.data.params["train.learning_rate"] == "0.05"


@pytest.mark.slow
@HEAVY
@pytest.mark.parametrize("strategy", ["auto", "multiworker"])
def test_num_proc_minus_two_trains_on_two_local_horovod_ranks_or_multiworker_workers(
    iris, tmp_path, mlflow_uri, strategy
):
    """HorovodRunner's np semantics: num_proc=-2 runs 2 Horovod processes on this host, or 2
    workers of TF's multi-worker strategy with strategy="multiworker"."""
    from pyspark.ml.feature import VectorAssembler

    features = VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="features")
    est = KerasEstimator(
        model=make_model(),
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        feature_cols=["features"],
        label_cols="label",
        batch_size=16,
        epochs=3,
        num_proc=-2,
        strategy=strategy,
        store=str(tmp_path / "store"),
        experiment=["callbacks.plots=false", "train.learning_rate=0.02"],
    )
    model = est.fit(features.transform(iris))
    run = mlflow.MlflowClient(mlflow_uri).get_run(model.getRunId())
    assert run.info.status == "FINISHED"
    engine = "multiworker" if strategy == "multiworker" else "horovod"
    assert run.data.params["runtime.strategy"] == engine and run.data.params["runtime.np"] == "-2"
    assert model.transform(features.transform(iris)).count() == 150
