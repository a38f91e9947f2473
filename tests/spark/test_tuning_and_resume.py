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
