"""Every Param has a getter and a setter and works in ParamGridBuilder; bad input stops ``fit``
before any training, with an error that names the column; the same rows are written once."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.ml.tuning import ParamGridBuilder
from pyspark.sql.types import DoubleType, StructField, StructType

from keras_dl.errors import ConfigError, DataError
from keras_dl.spark import KerasEstimator
from keras_dl.spark.params import SPECS
from tests.spark.conftest import make_model

VECTOR_SCHEMA = StructType([StructField("f", VectorUDT()), StructField("label", DoubleType())])
HOROVOD_NAMES = [
    "model", "optimizer", "loss", "metrics", "feature_cols", "label_cols", "validation",
    "batch_size", "val_batch_size", "epochs", "num_proc", "store", "callbacks", "random_seed",
    "verbose", "run_id",
]  # fmt: skip


def test_params_named_as_in_horovod_with_getters_setters_and_grids():
    est = KerasEstimator()
    names = {p.name for p in est.params}
    assert set(HOROVOD_NAMES) | {"experiment", "registered_model", "strategy"} <= names
    for name, _, _, _ in SPECS:
        camel = "".join(part.capitalize() for part in name.split("_"))
        assert callable(getattr(est, f"get{camel}")) and callable(getattr(est, f"set{camel}"))
    assert est.setBatchSize(8) is est and est.getBatchSize() == 8
    assert est.getNumProc() == 1 and est.getEpochs() == 1 and est.getStrategy() == "auto"
    assert KerasEstimator(label_cols="y").getLabelCols() == ["y"]
    grid = (
        ParamGridBuilder()
        .addGrid(est.epochs, [1, 2])
        .addGrid(est.optimizer, ["adam", "sgd"])
        .build()
    )
    assert len(grid) == 4
    assert est.copy(grid[3]).getEpochs() == 2 and est.copy(grid[3]).getOptimizer() == "sgd"
    with pytest.raises(ConfigError, match="validation=1.5"):
        KerasEstimator(validation=1.5)


def _estimator(tmp_path, **params):
    settings = dict(
        model=make_model(2, 3),
        loss="sparse_categorical_crossentropy",
        feature_cols=["f"],
        label_cols=["label"],
        epochs=1,
        store=str(tmp_path / "store"),
    )
    return KerasEstimator(**{**settings, **params})


def _frame(spark, features, labels, **extra):
    return spark.createDataFrame(pd.DataFrame({"f": features, "label": labels, **extra}))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(feature_cols=["nope"]), r"Column\(s\) 'nope' named in feature_cols are not in"),
        (dict(label_cols=["target"]), r"'target' named in label_cols"),
        (
            dict(feature_cols=["name"]),
            r"Feature column 'name' is string, not numeric.*StringIndexer",
        ),
        (dict(validation="is_val"), r"'is_val' named in validation"),
    ],
    ids=["missing feature", "missing label", "string feature", "missing validation column"],
)
@pytest.mark.connect_too
def test_columns_checked_by_name(spark, tmp_path, change, match):
    df = _frame(spark, [[0.0, 1.0]] * 4, [0.0, 1.0, 2.0, 1.0], name=["a", "b", "c", "d"])
    with pytest.raises(DataError, match=match):
        _estimator(tmp_path, **change).fit(df)


@pytest.mark.slow
def test_rows_checked_by_column(spark, tmp_path):
    est = _estimator(tmp_path)
    nulls = spark.createDataFrame([(Vectors.dense([0.0, 1.0]), 0.0), (Vectors.dense([1.0, 0.0]), None)], VECTOR_SCHEMA)  # fmt: skip
    with pytest.raises(DataError, match=r"Label column 'label' has 1 null value\(s\)"):
        est.fit(nulls)
    sizes = spark.createDataFrame([(Vectors.dense([0.0, 1.0]), 0.0), (Vectors.dense([1.0]), 1.0)], VECTOR_SCHEMA)  # fmt: skip
    with pytest.raises(
        DataError, match=r"Feature column 'f' holds vectors of different sizes \(1 to 2\)"
    ):
        est.fit(sizes)
    out_of_range = _frame(spark, [[0.0, 1.0]] * 3, [0.0, 1.0, 3.0])
    with pytest.raises(DataError, match=r"Label column 'label' holds values from 0 to 3.*0 to 2"):
        est.fit(out_of_range)
    fraction = _frame(spark, [[0.0, 1.0]] * 2, [0.0, 0.5])
    with pytest.raises(DataError, match="Label column 'label'.*class indexes"):
        est.fit(fraction)
    with pytest.raises(DataError, match="binary cross-entropy takes labels in"):
        _estimator(tmp_path, model=make_model(2, 1, "sigmoid"), loss="binary_crossentropy").fit(out_of_range)  # fmt: skip
    null_feature = spark.createDataFrame([([0.0, 1.0], 0.0), (None, 1.0)], "f array<double>, label double")  # fmt: skip
    with pytest.raises(DataError, match=r"Feature column 'f' has 1 null value\(s\)"):
        est.fit(null_feature)
    with pytest.raises(
        ConfigError, match=r"feature_cols give 2 values per row: f \(2\).*keras.Input\(\(2,\)\)"
    ):
        _estimator(tmp_path, model=make_model(5, 3)).fit(_frame(spark, [[0.0, 1.0]], [0.0]))


@pytest.mark.slow
def test_the_same_rows_are_materialized_once(spark, tmp_path, mlflow_uri):
    import mlflow

    def table_files(table):
        return {p.name: p.stat().st_mtime_ns for p in Path(table).rglob("*") if p.is_file()}

    features = [[float(i % 3), 1.0] for i in range(40)]
    labels = [float(i % 3) for i in range(40)]
    df = _frame(spark, features, labels)
    est = _estimator(tmp_path, batch_size=8, validation=0.25, experiment=["callbacks.plots=false"])
    first = est.fit(df)
    client = mlflow.MlflowClient(mlflow_uri)
    table = client.get_run(first.getRunId()).data.tags["data.table"]
    written = table_files(table)
    assert [n for n in written if n.endswith(".json")] == ["00000000000000000000.json"]
    second = est.setEpochs(2).fit(df)  # the same query plan
    third = est.fit(_frame(spark, features, labels))  # another plan, the same rows
    for model in (second, third):
        assert client.get_run(model.getRunId()).data.tags["data.table"] == table
    assert table_files(table) == written  # still version 0, no file rewritten
    assert len(list((tmp_path / "store" / "data").iterdir())) == 1
    assert len({first.getRunId(), second.getRunId(), third.getRunId()}) == 3
    other = est.fit(_frame(spark, features, labels[:-1] + [1.0]))  # one label differs (was 0)
    assert client.get_run(other.getRunId()).data.tags["data.table"] != table


def test_num_proc_and_strategy_pick_the_engine_and_multiworker_for_one_process_is_refused():
    from keras_dl.errors import ConfigError
    from keras_dl.spark.training import runtime_of

    assert runtime_of(2, "multiworker") == ("multiworker", 2)
    assert runtime_of(-2, "auto") == ("horovod", -2)
    assert runtime_of(1, "mirrored") == ("mirrored", 0)
    with pytest.raises(ConfigError, match=r"strategy='multiworker' with num_proc=1: .*num_proc=-N"):
        runtime_of(1, "multiworker")
