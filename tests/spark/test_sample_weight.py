"""KerasEstimator's ``sample_weight_col`` (Horovod's name): the column weighs each row's loss
and validation metrics through ``data.weight_column``, and is never a model input."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
from pyspark.sql import functions as F

from keras_dl.errors import DataError
from keras_dl.spark import KerasEstimator
from tests.spark.conftest import make_model


def _estimator(tmp_path, **params):
    import keras

    settings = dict(
        model=make_model(),
        optimizer=keras.optimizers.Adam(0.02),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        feature_cols=["sl", "sw", "pl", "pw"],
        label_cols=["label"],
        batch_size=16,
        epochs=12,
        store=str(tmp_path / "store"),
        experiment=["callbacks.plots=false"],
    )
    settings.update(params)
    return KerasEstimator(**settings)


@pytest.mark.slow
def test_sample_weight_col_zero_on_one_class_keeps_it_from_being_predicted(
    iris, tmp_path, mlflow_uri
):
    weighted = iris.withColumn("w", F.when(F.col("label") == 2, 0.0).otherwise(1.0))
    est = _estimator(tmp_path, sample_weight_col="w")
    assert est.getSampleWeightCol() == "w"
    model = est.fit(weighted)
    out = model.transform(iris.drop("label"))  # scoring needs no weight (nor label)
    predicted = np.array([r.prediction for r in out.select("prediction").collect()])
    labels = np.array([r.label for r in iris.select("label").collect()])
    assert (predicted[labels == 2] == 2).mean() < 0.2  # weight 0: never learned
    assert (predicted[labels == 0] == 0).mean() > 0.8
    run = mlflow.MlflowClient(mlflow_uri).get_run(model.getRunId())
    assert run.data.params["data.weight_column"] == "sample_weight"


@pytest.mark.connect_too
def test_a_missing_or_non_numeric_sample_weight_col_is_named(iris, tmp_path):
    with pytest.raises(DataError, match="'nope'.*sample_weight_col"):
        _estimator(tmp_path, sample_weight_col="nope").fit(iris)
    text = iris.withColumn("w", F.lit("heavy"))
    with pytest.raises(DataError, match="Sample-weight column 'w' .*string, not a number"):
        _estimator(tmp_path, sample_weight_col="w").fit(text)
