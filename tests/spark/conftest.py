"""Fixtures of the Spark ML tests: iris as a DataFrame (on the suite's ``spark``), a tiny model."""

from __future__ import annotations

import pytest


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
