"""Fixtures of the Spark ML tests: one local[2] SparkSession, iris as a DataFrame, a tiny model."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A local[2] SparkSession on loopback, no UI (about 10 s to start)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("keras_dl-tests-spark-ml")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def iris(spark):
    """scikit-learn's iris (150 rows): four double columns and a double class index."""
    import pandas as pd
    from sklearn.datasets import load_iris

    data = load_iris()
    frame = pd.DataFrame(data.data, columns=["sl", "sw", "pl", "pw"])
    frame["label"] = data.target.astype("float64")  # as StringIndexer gives it
    frame["id"] = range(len(frame))
    return spark.createDataFrame(frame).repartition(2).cache()


def make_model(inputs: int = 4, outputs: int = 3, activation: str = "softmax"):
    """A small dense network, seeded so its starting weights repeat."""
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(outputs, activation=activation),
        ]
    )
