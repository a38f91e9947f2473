"""A logged model refuses a null or NaN feature, naming the column, unless the model declares
the column optional: then the value is filled as at training time (the train split's mean, or
its most frequent string). The refusal is in the model's own pyfunc, so ``mlflow models serve``
(HTTP 400, tests/model/test_serving.py) and Spark scoring (tests/inference/test_inference.py) share it."""

import json
import os

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from mlflow.exceptions import MlflowException

from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import write_test_table


def _frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    size = rng.normal(50.0, 20.0, rows)
    weight = rng.normal(0.0, 1.0, rows)
    city = rng.choice(["north", "south", "south", "east"], rows)
    return pd.DataFrame(
        {
            "size": size,
            "weight": weight,
            "city": city,
            "tier": np.where(size + 10 * weight > 50, "high", "low"),
            "split": np.where(np.arange(rows) % 5 == 0, "validation", "train"),
        }
    )


@pytest.fixture(scope="module")
def houses(tmp_path_factory):
    frame = _frame(400)
    table = str(tmp_path_factory.mktemp("missing") / "houses")
    write_test_table(table, pa.Table.from_pandas(frame, preserve_index=False), 100)
    return table, frame


def _exp(table, tmp, *sets):
    recipe = load_recipe("tabular")
    return recipe, resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            "data.label=tier",
            "data.split_column=split",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
            f"runtime.run_dir={tmp / 'run'}",
            "train.epochs=1",
            "train.verbose=0",
            *sets,
        ],
    )


@pytest.mark.slow
def test_optional_columns_are_imputed_as_at_training_and_others_refused(houses, tmp_path):
    table, frame = houses
    fit(*reversed(_exp(table, tmp_path, "model.optional=size,city")))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    folder = mlflow.artifacts.download_artifacts("models:/tabular/1", dst_path=str(tmp_path / "m"))
    with open(os.path.join(folder, "data", "data", "keras_dl.json")) as f:
        impute = json.load(f)["impute"]
    train = frame[frame["split"] == "train"]
    assert impute["size"] == pytest.approx(train["size"].mean())
    assert impute["city"] == train["city"].value_counts().idxmax() == "south"
    model = mlflow.pyfunc.load_model(folder)
    required = {c.name: c.required for c in model.metadata.signature.inputs.inputs}
    assert required == {"size": False, "weight": True, "city": False}

    rows = frame[["size", "weight", "city"]].head(6).reset_index(drop=True)
    filled = rows.assign(size=impute["size"], city=impute["city"])
    expected = np.asarray(model.predict(filled))
    holes = rows.assign(size=np.nan, city=None)
    np.testing.assert_allclose(np.asarray(model.predict(holes)), expected, atol=1e-6)
    left_out = rows[["weight"]].assign(city=impute["city"])  # an optional column not sent
    np.testing.assert_allclose(np.asarray(model.predict(left_out)), expected, atol=1e-6)

    bad = rows.copy()
    bad.loc[[1, 4], "weight"] = np.nan
    with pytest.raises(MlflowException) as err:
        model.predict(bad)
    assert err.value.error_code == "INVALID_PARAMETER_VALUE"
    text = err.value.message
    assert "Column 'weight' has a missing value (null or NaN) in 2 row(s) (row 1, 4)" in text
    assert "optional columns: city, size" in text or "optional columns: size, city" in text


def test_optional_must_name_a_feature(houses, tmp_path):
    table, _ = houses
    recipe, exp = _exp(table, tmp_path, "model.optional=size,colour")
    with pytest.raises(ConfigError, match=r"model.optional names 'colour', not a feature"):
        fit(exp, recipe)


def test_a_tensor_model_refuses_nan_naming_its_input(tmp_path, mlflow_uri):
    """The digits kind: one tensor input, logged with the Keras flavor and keras_dl's loader."""
    import keras

    from keras_dl.model.publish import log_keras_model

    inputs = keras.Input(shape=(64,), name="pixels")
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))
    with mlflow.start_run():
        uri, _ = log_keras_model(model, np.zeros((2, 64), np.float32), None)
    pyfunc = mlflow.pyfunc.load_model(uri)
    pixels = np.ones((3, 64))
    np.testing.assert_allclose(pyfunc.predict(pixels), model.predict(pixels, verbose=0), atol=1e-6)
    assert type(mlflow.keras.load_model(uri)).__name__ == "Functional"  # Keras flavor kept
    pixels[2, 7] = np.nan
    with pytest.raises(MlflowException, match=r"Column 'pixels' has a missing value .* \(row 2\)"):
        pyfunc.predict(pixels)
