"""Several labels (``data.label`` a list): one output head per label, each with its own loss and
metrics, judged head by head by the registry gate, and scored one column per head in-process,
through pyfunc and on Spark."""

import json

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keras_dl.config import resolve
from keras_dl.data.stream.features import plan_columns
from keras_dl.data.tables import open_table
from keras_dl.data.training_rows import read_table
from keras_dl.errors import ConfigError, DataError
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import run_cli, runs_in, write_test_table

CLASSES = ["high", "low", "mid"]


def _frame(rows: int, seed: int = 0) -> pd.DataFrame:
    """Numeric and string features; a string label (tier), a float label (price), a label whose
    relation to the features is reversed in the validation rows (flip) and a weight column."""
    rng = np.random.default_rng(seed)
    size = rng.normal(50.0, 20.0, rows)
    rooms = rng.integers(1, 6, rows)
    city = rng.choice(["north", "south", "east"], rows)
    bonus = np.select([city == "north", city == "south"], [2.0, -2.0], 0.0)
    score = (size - 50.0) / 20.0 + 0.5 * (rooms - 3) + bonus
    split = np.where(np.arange(rows) % 5 == 0, "validation", "train")
    big = size > 50.0
    return pd.DataFrame(
        {
            "id": np.arange(rows, dtype=np.int64),
            "size": size,
            "rooms": rooms.astype(np.int64),
            "city": city,
            "tier": np.where(score > 0.5, "high", np.where(score < -0.5, "low", "mid")),
            "price": 1000.0 * score + 5000.0,
            # Learnable on the training rows, the opposite on the validation rows: no model
            # beats the majority class there.
            "flip": np.where(big == (split == "train"), "yes", "no"),
            "w": rng.uniform(0.5, 1.5, rows),
            "split": split,
        }
    )


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    frame = _frame(1000)
    delta = str(root / "houses")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    write_test_table(delta, table, 200, partition_by=["split"])
    return delta, frame


def _exp(table, tmp, *sets):
    recipe = load_recipe("tabular")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
            f"runtime.run_dir={tmp / 'run'}",
            "data.split_column=split",
            "data.features=size,rooms,city",
            "train.verbose=0",
            *sets,
        ],
    )
    return exp, recipe


@pytest.fixture(scope="module")
def trained(tables, tmp_path_factory):
    """tier (classification) and price (regression) heads, rows weighed by w, registered."""
    delta, _ = tables
    tmp = tmp_path_factory.mktemp("heads_run")
    exp, recipe = _exp(
        delta, tmp, "data.label=tier,price", "data.weight_column=w", "train.epochs=15"
    )
    result = fit(exp, recipe)
    assert mlflow.active_run() is None
    return result, exp.tracking.uri, tmp


@pytest.mark.slow
def test_two_labels_train_with_per_head_metrics_and_register(trained):
    result, uri, _ = trained
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    assert result.registered_version == 1
    metrics = run.data.metrics
    for name in ("val_tier_accuracy", "val_tier_loss", "val_price_mae", "val_price_rmse"):
        assert name in metrics, sorted(metrics)
    assert "val_accuracy" not in metrics and "val_mae" not in metrics
    assert result.history["val_tier_accuracy"][-1] >= 0.8, result.history
    assert result.history["val_price_rmse"][-1] < 600, result.history  # label spread ~1500
    assert json.loads(run.data.tags["keras_dl.task"]) == {
        "tier": "classification",
        "price": "regression",
    }
    assert json.loads(run.data.tags["keras_dl.classes"]) == {"tier": CLASSES, "price": []}
    gate = run.data.tags["keras_dl.gate"]
    assert "head 'tier': val_tier_accuracy=" in gate and "majority class" in gate, gate
    assert "head 'price': val_price_mse" in gate or "head 'price': val_price_rmse" in gate, gate


@pytest.mark.slow
def test_pyfunc_and_in_process_scores_give_one_column_per_head(trained, tables):
    result, uri, _ = trained
    _, frame = tables
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/tabular/1")
    signature = model.metadata.signature
    assert [c.name for c in signature.outputs.inputs] == ["tier", "price"]
    raw = frame[["size", "rooms", "city"]].head(200)
    scored = model.predict(raw)
    assert list(scored.columns) == ["tier", "price"]
    probs = np.stack(scored["tier"].to_numpy())
    assert probs.shape == (200, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    direct = result.model.predict(
        {"size": raw["size"].to_numpy(), "rooms": raw["rooms"].to_numpy(),
         "city": raw["city"].to_numpy(dtype=object)},
        verbose=0,
    )  # fmt: skip
    np.testing.assert_allclose(probs, direct["tier"], atol=1e-5)
    np.testing.assert_allclose(scored["price"], direct["price"].reshape(-1), rtol=1e-5)
    assert (np.array(CLASSES)[probs.argmax(1)] == frame["tier"].head(200)).mean() >= 0.8


@pytest.mark.slow
def test_spark_scores_one_prediction_column_per_head(trained, tables, spark):
    from keras_dl.inference import predict

    _, uri, _ = trained
    _, frame = tables
    rows = frame[["id", "size", "rooms", "city"]].head(300)
    scored = predict(
        spark.createDataFrame(rows).repartition(2), "models:/tabular/1", keys=["id"],
        batch_size=64, tracking_uri=uri,
    ).toPandas().sort_values("id")  # fmt: skip
    probability = [f"probability_tier_{c}" for c in CLASSES]
    assert list(scored.columns) == ["id", "prediction_tier", *probability, "prediction_price"]
    mlflow.set_tracking_uri(uri)
    local = mlflow.pyfunc.load_model("models:/tabular/1").predict(rows[["size", "rooms", "city"]])
    probs = np.stack(local["tier"].to_numpy())
    np.testing.assert_allclose(scored[probability].to_numpy(), probs, atol=1e-5)
    assert list(scored["prediction_tier"]) == list(np.array(CLASSES)[probs.argmax(1)])
    np.testing.assert_allclose(scored["prediction_price"], local["price"], rtol=1e-4)


@pytest.mark.slow
def test_predict_command_writes_one_column_per_head(trained, tables):
    _, uri, tmp = trained
    delta, frame = tables
    out = str(tmp / "scores")
    proc = run_cli(
        "predict", "--model", "models:/tabular/1", "--table", delta, "--out", out,
        "--master", "local[1]", "--tracking-uri", uri, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = read_table(out).to_pandas().sort_values("id")
    assert len(scores) == len(frame)
    assert {"id", "tier", "price", "prediction_tier", "prediction_price"} <= set(scores.columns)
    assert (scores["prediction_tier"] == scores["tier"]).mean() >= 0.8
    assert np.abs(scores["prediction_price"] - scores["price"]).mean() < 600


@pytest.mark.slow
def test_must_beat_compares_every_head_with_the_champion_s_same_head(trained, tables, tmp_path):
    delta, _ = tables
    _, uri, _ = trained
    client = mlflow.MlflowClient(uri)
    client.set_registered_model_alias("tabular", "champion", "1")
    exp, recipe = _exp(
        delta,
        tmp_path,
        "data.label=tier,price",
        "data.weight_column=w",
        "train.epochs=15",
        f"tracking.uri={uri}",
        "registry.must_beat=champion",
    )
    try:
        result = fit(exp, recipe)
    finally:
        client.delete_registered_model_alias("tabular", "champion")
    run = mlflow.MlflowClient(uri).get_run(result.run_id)
    lines = run.data.tags["keras_dl.gate"].split("; ")
    against = [line for line in lines if "tabular@champion (version 1)" in line]
    # One comparison per head, each on that head's own main metric.
    assert len(against) == 2, lines
    assert any(line.startswith("val_tier_accuracy=") for line in against), against
    assert any(line.startswith("val_price_") for line in against), against
    won = all(" beats tabular@champion" in line for line in against)
    assert (result.registered_version is not None) == won, (result.registered_version, against)
    if not won:
        assert "does not beat tabular@champion" in run.data.tags["keras_dl.not_registered"]


@pytest.mark.slow
def test_one_head_below_its_baseline_keeps_the_model_unregistered(tables, tmp_path):
    delta, _ = tables
    exp, recipe = _exp(delta, tmp_path, "data.label=tier,flip", "train.epochs=10")
    result = fit(exp, recipe)
    assert result.registered_version is None
    (run,) = runs_in(exp.tracking.uri)
    reason = run.data.tags["keras_dl.not_registered"]
    assert "head 'flip': val_flip_accuracy=" in reason and "does not beat" in reason, reason
    gate = run.data.tags["keras_dl.gate"]
    assert "head 'tier': val_tier_accuracy=" in gate and "beats" in gate, gate
    client = mlflow.MlflowClient(exp.tracking.uri)
    assert not client.search_model_versions("name='tabular'")


def test_several_labels_are_parsed_from_set_and_yaml(tables, tmp_path):
    delta, _ = tables
    exp, _ = _exp(delta, tmp_path, "data.label=tier,price")
    assert exp.data.label == ("tier", "price") and exp.data.labels == ("tier", "price")
    one, _ = _exp(delta, tmp_path, "data.label=tier")
    assert one.data.label == "tier" and one.data.labels == ("tier",)
    listed, _ = _exp(delta, tmp_path, "data.label=[price]")
    assert listed.data.labels == ("price",)


def test_label_errors_name_data_label(tables, tmp_path):
    delta, _ = tables
    with pytest.raises(ConfigError, match=r"data.label names 'tier' more than once"):
        _exp(delta, tmp_path, "data.label=tier,price,tier")
    with pytest.raises(ConfigError, match=r"data.label 'size' is also in data.features"):
        _exp(delta, tmp_path, "data.label=tier,size")
    with pytest.raises(ConfigError, match=r"train.class_weight .* data.label names 2"):
        _exp(delta, tmp_path, "data.label=tier,flip", "train.class_weight=balanced")
    exp, recipe = _exp(delta, tmp_path, "data.label=tier,target")
    with pytest.raises(DataError, match=r"'target' is not in table .*data.label"):
        fit(exp, recipe)
    snapshot = open_table(delta)
    with pytest.raises(DataError, match=r"'target'.* named in data.label are not in table"):
        plan_columns(snapshot, (), ("tier", "target"), accept=("numeric", "string"))
    with pytest.raises(DataError, match=r"data.label=\['tier', 'tier'\] names a column twice"):
        plan_columns(snapshot, (), ("tier", "tier"), accept=("numeric", "string"))
    plan = plan_columns(snapshot, (), ("tier", "price"), ["split"], ("numeric", "string"))
    assert [s.name for s in plan.labels] == ["tier", "price"]
    assert "tier" not in [s.name for s in plan.features] and plan.heads


def test_a_one_label_recipe_refuses_several(digits_table, tmp_path):
    recipe = load_recipe("digits")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={digits_table}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "data.label=label,split",
        ],
    )
    with pytest.raises(ConfigError, match=r"data.label names 2 columns .* recipe 'digits'"):
        fit(exp, recipe)
    assert not runs_in(exp.tracking.uri)
