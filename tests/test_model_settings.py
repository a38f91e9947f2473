"""A recipe's ``model.*`` settings are checked before any run starts: their ranges when the config
is resolved, ``model.num_classes`` against the table's labels before the MLflow run is created.
Each error names the key, the value and what is allowed. Real Delta tables, SQLite MLflow."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from keras_dl.config import Bounds, resolve
from keras_dl.errors import ConfigError
from keras_dl.recipe import check_num_classes, list_recipes, load_recipe
from tests.conftest import runs_in, train_digits


@pytest.mark.parametrize(
    "recipe, item, message",
    [
        ("digits", "model.dropout=2", "model.dropout=2.0 is outside the allowed range [0, 1)"),
        ("digits", "model.dropout=1", "model.dropout=1.0 is outside the allowed range [0, 1)"),
        ("digits", "model.dropout=-0.1", "model.dropout=-0.1 is outside"),
        ("digits", "model.num_classes=1", "model.num_classes=1 is outside the allowed range >= 2"),
        ("digits", "model.filters=0", "model.filters=0 is outside the allowed range >= 1"),
        ("digits", "model.dense=-3", "model.dense=-3 is outside the allowed range >= 1"),
        ("digits", "model.shift=1.5", "model.shift=1.5 is outside the allowed range [0, 1]"),
        ("flowers", "model.dropout=1.2", "model.dropout=1.2 is outside the allowed range [0, 1)"),
        ("flowers", "model.num_classes=0", "model.num_classes=0 is outside"),
        ("flowers", "model.alpha=0", "model.alpha=0.0 is outside the allowed range > 0"),
        ("flowers", "model.fine_tune_layers=-1", "model.fine_tune_layers=-1 is outside"),
        ("tabular", "model.hidden=64,0", "model.hidden=64,0 has 0, which is outside"),
        ("tabular", "model.dropout=5", "model.dropout=5.0 is outside the allowed range [0, 1)"),
        ("tabular", "model.embedding_dim=0", "model.embedding_dim=0 is outside"),
        ("tabular", "model.stats_rows=0", "model.stats_rows=0 is outside"),
        ("tabular", "model.task=ranking", "model.task='ranking' is not one of auto"),
    ],
)
def test_model_values_out_of_range_are_refused_when_the_config_is_resolved(recipe, item, message):
    defaults = load_recipe(recipe).defaults
    with pytest.raises(ConfigError) as err:
        resolve(defaults, sets=["data.table=/tmp/t", item])
    assert message in str(err.value)
    key = item.split("=")[0]
    assert f"--set {key}=" in str(err.value)  # and how to fix it


@pytest.mark.parametrize("recipe", list_recipes())
def test_every_recipes_defaults_and_edge_values_are_accepted(recipe):
    sets = ["data.table=/tmp/t", "model.dropout=0"]
    if recipe == "tabular":
        sets += ["model.hidden=", "model.embed_above=0"]  # no hidden layer: a linear model
    exp = resolve(load_recipe(recipe).defaults, sets=sets)
    assert exp.model.dropout == 0


def test_bounds_read_as_ranges():
    assert str(Bounds(0, 1, high_open=True)) == "[0, 1)"
    assert str(Bounds(0, low_open=True)) == "> 0" and str(Bounds(high=5)) == "<= 5"
    assert Bounds(0, 1, high_open=True).allows(0) and not Bounds(0, 1, high_open=True).allows(1)


def test_num_classes_below_the_labels_fails_before_any_mlflow_run(digits_table, tmp_path):
    with pytest.raises(ConfigError) as err:
        train_digits(digits_table, tmp_path, "model.num_classes=3", "train.epochs=1")
    text = str(err.value)
    assert text.startswith("model.num_classes=3 is too few for table ")
    assert "'label' holds 10 distinct values from 0 to 9" in text
    assert "--set model.num_classes=10" in text
    assert runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}") == []  # no run was created
    assert not (tmp_path / "run" / "config.yaml").exists()  # nor the run folder written


def test_a_dropout_out_of_range_fails_before_any_mlflow_run(digits_table, tmp_path):
    with pytest.raises(ConfigError, match=r"model.dropout=2.0 is outside the allowed range"):
        train_digits(digits_table, tmp_path, "model.dropout=2")
    assert runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}") == []


def _labels_table(path, labels):
    write_deltalake(str(path), pa.table({"x": [0.5] * len(labels), "label": labels}))
    return str(path)


def test_num_classes_is_checked_against_a_separate_validation_table_too(tmp_path):
    train = _labels_table(tmp_path / "train", [0, 1, 2, 1])
    val = _labels_table(tmp_path / "val", [0, 4])  # a class the training rows lack
    exp = resolve(
        load_recipe("flowers").defaults,
        sets=[f"data.table={train}", f"data.validation_table={val}", "data.split_column=null"],
    )
    exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, num_classes=3))
    with pytest.raises(ConfigError, match=r"model.num_classes=3 is too few for table .*val'"):
        check_num_classes(exp)
    check_num_classes(dataclasses.replace(exp, model=dataclasses.replace(exp.model, num_classes=5)))


def test_a_negative_label_is_named(tmp_path):
    table = _labels_table(tmp_path / "t", [0, -1, 2])
    exp = resolve(load_recipe("digits").defaults, sets=[f"data.table={table}"])
    with pytest.raises(ConfigError, match=r"Label column 'label' of table .* holds -1"):
        check_num_classes(exp)


def test_the_horovod_launcher_checks_num_classes_before_it_creates_the_run(digits_table, tmp_path):
    pytest.importorskip("horovod.tensorflow.keras", reason="the launcher needs Horovod")
    from keras_dl.launch import launch

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = resolve(
        load_recipe("digits").defaults,
        sets=[
            f"data.table={digits_table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "runtime.strategy=horovod",
            "runtime.np=-2",
            "model.num_classes=3",
        ],
    )
    with pytest.raises(ConfigError, match=r"model.num_classes=3 is too few"):
        launch(exp)  # refused before the driver creates the MLflow run or starts a rank
    assert runs_in(uri) == []
