"""The tabular recipe on tables it has never seen: classification from a string label, regression
from a float label, each with numeric and string features, served from raw columns."""

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keras_dl.config import resolve
from keras_dl.errors import DataError
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import run_cli, runs_in, write_test_table


def _frame(rows: int, seed: int = 0) -> pd.DataFrame:
    """Two numeric columns, a string column, and labels that depend on all three."""
    rng = np.random.default_rng(seed)
    size = rng.normal(50.0, 20.0, rows)  # a large scale: normalization must handle it
    rooms = rng.integers(1, 6, rows)
    city = rng.choice(["north", "south", "east"], rows)
    bonus = np.select([city == "north", city == "south"], [2.0, -2.0], 0.0)
    score = (size - 50.0) / 20.0 + 0.5 * (rooms - 3) + bonus
    return pd.DataFrame(
        {
            "size": size,
            "rooms": rooms.astype(np.int64),
            "city": city,
            "tier": np.where(score > 0.5, "high", np.where(score < -0.5, "low", "mid")),
            "price": 1000.0 * score + 5000.0,
            "split": np.where(np.arange(rows) % 5 == 0, "validation", "train"),
        }
    )


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("tabular")
    frame = _frame(1200)
    delta = str(root / "houses")
    write_test_table(
        delta, pa.Table.from_pandas(frame, preserve_index=False), 200, partition_by=["split"]
    )
    return root, delta, frame


def _fit(table, tmp, *sets):
    recipe = load_recipe("tabular")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp / 'run'}",
            "data.split_column=split",
            "train.verbose=0",
            *sets,
        ],
    )
    return fit(exp, recipe), uri


@pytest.mark.slow
def test_string_label_is_classification_served_from_raw_columns(tables, tmp_path):
    _, delta, frame = tables
    result, uri = _fit(
        delta, tmp_path, "data.label=tier", "data.features=size,rooms,city", "train.epochs=15"
    )
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["keras_dl.task"] == "classification"
    assert json.loads(run.data.tags["keras_dl.classes"]) == ["high", "low", "mid"]
    assert result.history["val_accuracy"][-1] >= 0.85, result.history
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/tabular/1")
    inputs = {i.name: i.type.name for i in model.metadata.signature.inputs.inputs}
    assert inputs == {"size": "double", "rooms": "long", "city": "string"}
    raw = frame[["size", "rooms", "city"]].head(300).copy()
    raw.loc[0, "city"] = "atlantis"  # an unseen category goes to the out-of-vocabulary slot
    probs = np.asarray(model.predict(raw))
    assert probs.shape == (300, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    classes = np.array(["high", "low", "mid"])
    assert (classes[probs.argmax(1)][1:] == frame["tier"].head(300)[1:]).mean() >= 0.85


@pytest.mark.slow
def test_float_label_is_regression_through_the_module_entry(tables, tmp_path):
    root, _, frame = tables
    parquet = root / "houses_parquet"  # plain Parquet, hive-partitioned by split
    for split, rows in frame.drop(columns=["tier"]).groupby("split"):
        (parquet / f"split={split}").mkdir(parents=True, exist_ok=True)
        rows.drop(columns=["split"]).to_parquet(
            parquet / f"split={split}" / "part-0.parquet", index=False
        )
    proc = run_cli(
        "-m",
        "recipes.tabular",
        "--set",
        f"data.table={parquet}",
        "--set",
        "data.label=price",
        "--set",
        "data.split_column=split",
        "--set",
        "train.epochs=12",
        "--set",
        "train.verbose=0",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.data.tags["keras_dl.task"] == "regression"
    metrics = run.data.metrics
    assert "val_mae" in metrics and "val_rmse" in metrics and "val_accuracy" not in metrics
    # The label's spread is ~1500; a model that learned nothing has an RMSE around that.
    assert metrics["val_rmse"] < 500, metrics
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/tabular/1")
    pred = np.asarray(model.predict(frame[["size", "rooms", "city"]].head(50))).ravel()
    assert np.abs(pred - frame["price"].head(50)).mean() < 500


@pytest.mark.slow
def test_packed_columns_train_as_one_tensor_and_serve_by_name(tmp_path):
    """Numeric columns of one dtype reach the model packed (the recipe's default); the logged
    model takes every column by name, imputes its optional one, and predicts what the trained
    model predicts from the packed tensors."""
    import tensorflow as tf

    frame = _frame(600)
    frame["area"] = frame["size"] * 0.8 + np.arange(600) % 7  # float64, like size
    frame["floors"] = (frame["rooms"] % 3 + 1).astype(np.int64)  # int64, like rooms
    table = str(tmp_path / "houses")
    write_test_table(
        table, pa.Table.from_pandas(frame, preserve_index=False), 100, partition_by=["split"]
    )
    result, uri = _fit(
        table,
        tmp_path,
        "data.label=tier",
        "data.features=size,rooms,city,area,floors",
        "model.optional=area",
        "train.epochs=4",
    )
    # The run's model takes the columns by name; the model trained on packed tensors is inside.
    assert list(result.model.input) == ["size", "area", "rooms", "floors", "city"]
    trained = packed_inside(result.model)
    assert list(trained.input) == ["__packed_float64", "__packed_int64", "city"]
    assert tuple(trained.input["__packed_float64"].shape) == (None, 2)
    mlflow.set_tracking_uri(uri)
    logged = mlflow.pyfunc.load_model(result.model_uri)
    inputs = {i.name: (i.type.name, i.required) for i in logged.metadata.signature.inputs.inputs}
    assert inputs == {
        "size": ("double", True),
        "area": ("double", False),
        "rooms": ("long", True),
        "floors": ("long", True),
        "city": ("string", True),
    }
    rows = frame[["size", "rooms", "city", "area", "floors"]].head(64).copy()

    def packed(rows):
        return {
            "__packed_float64": np.stack([rows["size"], rows["area"]], 1),
            "__packed_int64": np.stack([rows["rooms"], rows["floors"]], 1),
            "city": tf.constant(rows["city"].to_numpy(object), tf.string),
        }

    want = trained.predict(packed(rows), verbose=0)
    np.testing.assert_allclose(np.asarray(logged.predict(rows)), want, rtol=1e-6, atol=1e-7)
    folder = Path(mlflow.artifacts.download_artifacts(result.model_uri))
    (spec_file,) = folder.rglob("keras_dl.json")
    spec = json.loads(spec_file.read_text())
    fill = spec["impute"]["area"]
    assert fill == pytest.approx(frame.loc[frame["split"] == "train", "area"].mean())
    holes = rows.copy()
    holes.loc[[0, 5], "area"] = np.nan  # imputed by name, before the columns are packed
    filled = rows.copy()
    filled.loc[[0, 5], "area"] = fill
    np.testing.assert_allclose(
        np.asarray(logged.predict(holes)),
        trained.predict(packed(filled), verbose=0),
        rtol=1e-6,
        atol=1e-7,
    )
    holes.loc[3, "size"] = np.nan  # not optional: refused by name
    with pytest.raises(mlflow.exceptions.MlflowException, match="size"):
        logged.predict(holes)


def test_missing_label_lists_the_columns(tables, tmp_path):
    _, delta, _ = tables
    with pytest.raises(DataError, match=r"'target' is not in table .*size, rooms, city, tier"):
        _fit(delta, tmp_path, "data.label=target")


def test_float_label_forced_to_classification_with_too_many_classes(tables, tmp_path):
    _, delta, _ = tables
    with pytest.raises(DataError, match="too many for classification"):
        _fit(delta, tmp_path, "data.label=price", "model.task=classification")


@pytest.mark.slow
def test_column_names_delta_allows_work_end_to_end(spark, tmp_path):
    """Spaces (as Databricks' column-mapped tables have), "/", "." and non-ASCII: as features
    of the tabular recipe, Keras inputs, the model signature, pyfunc serving and Spark scoring,
    on a column-mapped Delta table with a deletion vector."""
    from tests.fixtures.delta_protocol import write_protocol_table

    frame = _frame(600).rename(
        columns={"size": "size/m2", "rooms": "rooms.count", "city": "city name", "tier": "niveau é"}
    )
    frame["area m²"] = frame["size/m2"] * 0.8 + np.arange(600) % 5  # packed with "size/m2"
    frame["row"] = np.arange(600)  # not a feature: the key of a scored row
    cols = ["size/m2", "rooms.count", "city name", "area m²", "niveau é", "row"]
    parts, values = [], []
    for split, rows in frame.groupby("split"):
        for chunk in np.array_split(rows[cols], 2):
            parts.append([pa.Table.from_pandas(chunk, preserve_index=False)])
            values.append(split)
    table = str(tmp_path / "mapped")
    write_protocol_table(
        table, parts, [[0, 1]] + [[]] * (len(parts) - 1), mapping=True, partition=("split", values)
    )
    result, uri = _fit(
        table,
        tmp_path,
        "data.label=niveau é",
        "data.features=size/m2,rooms.count,city name,area m²",
        "train.epochs=8",
    )
    assert result.history["val_accuracy"][-1] >= 0.7, result.history
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/tabular/1")
    assert list(packed_inside(result.model).input) == [
        "__packed_float64",
        "rooms.count",
        "city name",
    ]
    names = [i.name for i in model.metadata.signature.inputs.inputs]
    assert names == ["size/m2", "area m²", "rooms.count", "city name"]  # the packed ones first
    probs = np.asarray(model.predict(frame[names].head(40)))
    assert probs.shape == (40, 3)

    from keras_dl.inference import predict
    from keras_dl.inference.tables import read_table_into_spark

    # The suite's session: one made here with getOrCreate would be the worker's own, and
    # stopping it stopped every later Spark test of the worker (seen when the order changed).
    df, snapshot = read_table_into_spark(spark, table)
    assert df.count() == len(frame) - 2  # the deletion vector's two rows are gone
    scored = predict(df, "models:/tabular/1", tracking_uri=uri).toPandas()
    assert len(scored) == len(frame) - 2 and "prediction" in scored.columns
    # Spark scores the named columns as pyfunc does (both pack them in the logged model).
    probabilities = scored[[c for c in scored.columns if c.startswith("probability_")]]
    rows = frame.set_index("row").loc[scored["row"], names]
    np.testing.assert_allclose(probabilities.to_numpy(), np.asarray(model.predict(rows)), atol=1e-5)


def packed_inside(model):
    """The model trained on packed features, inside the run's model that takes named columns."""
    import keras

    return next(layer for layer in model.layers if isinstance(layer, keras.Model))
