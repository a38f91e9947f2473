"""CrossValidator and TrainValidationSplit over the estimator's Params: every trial is an MLflow
child run of the run around them. A fit that fails resumes from its checkpoint by run_id."""

from __future__ import annotations

import keras
import mlflow
import pytest
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit

from keras_dl.spark import KerasEstimator
from tests.conftest import runs_in
from tests.spark.conftest import make_model

pytestmark = pytest.mark.slow


def _estimator(store, **params):
    settings = dict(
        model=make_model(),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        feature_cols=["sl", "sw", "pl", "pw"],  # plain number columns, concatenated
        label_cols=["label"],
        batch_size=30,
        epochs=1,
        store=str(store),
        experiment=["callbacks.plots=false", "tracking.log_model=false"],
    )
    return KerasEstimator(**{**settings, **params})


@pytest.mark.connect_too
def test_tuning_trials_are_child_runs(iris, tmp_path, mlflow_uri):
    est = _estimator(tmp_path / "store")
    grid = ParamGridBuilder().addGrid(est.optimizer, ["adam", "sgd"]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    tvs = TrainValidationSplit(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, trainRatio=0.7, seed=1)  # fmt: skip
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid[:1], evaluator=evaluator, numFolds=2, seed=1)  # fmt: skip
    mlflow.set_experiment("tuning")
    for tuner, fits in ((tvs, 3), (cv, 3)):  # the trials, then the best refit on all rows
        with mlflow.start_run() as parent:
            best = tuner.fit(iris)
        client = mlflow.MlflowClient(mlflow_uri)
        children = client.search_runs(
            [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
        )
        assert len(children) == fits, type(tuner).__name__
        assert all(r.info.status == "FINISHED" for r in children)
        assert best.bestModel.getRunId() in {r.info.run_id for r in children}
    assert {r.data.params["train.optimizer"] for r in children} == {"adam"}
    assert mlflow.active_run() is None


def test_trials_of_a_pipeline_are_child_runs_and_without_a_run_they_stand_alone(
    iris, tmp_path, mlflow_uri
):
    """A Pipeline's trials fit in pool threads too: the estimator's copies know the run."""
    from pyspark.ml import Pipeline

    est = _estimator(tmp_path / "store", feature_cols=["x"])
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="x"), est])  # fmt: skip
    grid = ParamGridBuilder().addGrid(est.optimizer, ["adam", "sgd"]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=1)  # fmt: skip
    client = mlflow.MlflowClient(mlflow_uri)
    mlflow.set_experiment("pipeline-tuning")
    with mlflow.start_run() as parent:
        best = cv.fit(iris)
    runs = client.search_runs([parent.info.experiment_id])
    children = [r for r in runs if r.info.run_id != parent.info.run_id]
    assert len(children) == len(grid) * 2 + 1  # 2 param maps x 2 folds, and the refit
    assert {r.data.tags.get("mlflow.parentRunId") for r in children} == {parent.info.run_id}
    assert {r.data.params["train.optimizer"] for r in children} == {"adam", "sgd"}
    assert best.bestModel.stages[-1].getRunId() in {r.info.run_id for r in children}
    # Without an active run nothing groups the trials: each is a top-level run of its own.
    before = {r.info.run_id for r in runs_in(mlflow_uri)}
    tvs = TrainValidationSplit(estimator=est.copy().setFeatureCols(["sl", "sw", "pl", "pw"]), estimatorParamMaps=grid[:1], evaluator=evaluator, trainRatio=0.7, seed=1)  # fmt: skip
    tvs.fit(iris)
    alone = [r for r in runs_in(mlflow_uri) if r.info.run_id not in before]
    assert len(alone) == 2  # the trial and the refit
    assert all("mlflow.parentRunId" not in r.data.tags for r in alone)


class _Crash(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("crash after epoch 2")


def test_failed_fit_resumes_by_run_id(iris, tmp_path, mlflow_uri):
    df = VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="x").transform(iris)
    est = _estimator(tmp_path / "store", epochs=4, validation=0.2).setFeatureCols(["x"])
    with pytest.raises(RuntimeError, match="crash after epoch 2") as err:
        est.setCallbacks([_Crash()]).fit(df)
    note = "\n".join(getattr(err.value, "__notes__", []))
    run_id = note.split("MLflow run ")[1].split(":")[0]
    client = mlflow.MlflowClient(mlflow_uri)
    assert client.get_run(run_id).info.status == "FAILED"
    model = est.setCallbacks([]).setRunId(run_id).fit(df)
    assert model.getRunId() == run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run_id, "val_loss")]
    assert steps == [0, 1, 2, 3]  # two epochs before the crash, two after: no gap, no repeat
    with pytest.raises(Exception, match="no checkpoint folder"):
        est.setRunId("0" * 32).fit(df)
