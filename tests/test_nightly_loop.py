"""The nightly loop, end to end on a Delta table on disk and MLflow on SQLite: train on v0 and
crown it champion; rows land (v1); fine-tune from models:/loop@champion on (v0, v1] only; the
gate compares with the champion and moves the alias only when the fine-tune earned it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import keras
import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from keras_dl.config import resolve
from keras_dl.errors import ConfigError, KerasDLError
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import seed_store, write_test_table

NAME = "loop"
GATE = ("registry.must_beat=champion", "registry.set_alias=champion")


def rows(n_train: int, n_eval: int, seed: int, sign: float = 1.0) -> pa.Table:
    """A regression table: ``y = 2 x1 - x2`` (times ``sign`` on the train split only)."""
    rng = np.random.default_rng(seed)
    n = n_train + 2 * n_eval
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    split = ["train"] * n_train + ["validation"] * n_eval + ["test"] * n_eval
    y = 2 * x1 - x2 + 0.05 * rng.normal(size=n)
    y[:n_train] *= sign
    return pa.table({"x1": x1, "x2": x2, "y": y, "split": split, "batch": [seed] * n})


def train(table: str, tmp: Path, run: str, *sets: str, callbacks=()):
    recipe = load_recipe("tabular")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            "data.label=y",
            "data.features=x1,x2",
            "data.split_column=split",
            f"tracking.uri={seed_store(tmp / 'mlflow.db')}",
            f"tracking.registered_model={NAME}",
            f"runtime.run_dir={tmp / run}",
            "train.verbose=0",
            "train.batch_size=32",
            "callbacks.plots=false",
            *sets,
        ],
    )
    try:
        return fit(exp, recipe, callbacks=callbacks)
    finally:
        assert mlflow.active_run() is None


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    """v0 (300 training rows) trained briefly, registered as loop/1 and crowned champion."""
    tmp = tmp_path_factory.mktemp("loop")
    table = write_test_table(str(tmp / "v0"), rows(300, 60, seed=0), rows_per_group=100)
    result = train(table, tmp, "v0", "train.epochs=2", *GATE)
    assert result.registered_version == 1
    client = mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    assert int(client.get_model_version_by_alias(NAME, "champion").version) == 1
    return tmp, table, client


def append(champion, tmp_path, new: pa.Table) -> str:
    """A copy of the v0 table with ``new`` appended as v1."""
    from deltalake import write_deltalake

    table = str(tmp_path / "table")
    shutil.copytree(champion[1], table)
    write_deltalake(table, new, mode="append")
    return table


@pytest.mark.slow
def test_a_fine_tune_on_the_appended_rows_that_beats_the_champion_is_promoted(champion, tmp_path):
    tmp, _, client = champion
    before = client.get_model_version_by_alias(NAME, "champion")
    table = append(champion, tmp_path, rows(160, 40, seed=1))
    init_from = f"models:/{NAME}@champion"
    sets = ["data.since_version=0", f"model.init_from={init_from}", "train.epochs=15"]
    result = train(table, tmp, f"v1-{tmp_path.name}", *sets, "train.learning_rate=0.01", *GATE)

    run = client.get_run(result.run_id)
    params, tags = run.data.params, run.data.tags
    # It started from the champion, recorded as given and pinned to the version it resolved to.
    assert params["model.init_from"] == init_from
    assert tags["keras_dl.init_from"] == f"models:/{NAME}/{before.version}"
    assert tags["keras_dl.init_from.run_id"] == before.run_id
    # It trained on the appended rows only: 160 of them, not the 460 training rows in v1.
    assert params["data.train_rows"] == "160"
    assert params["data.version_range"] == "(0,1]"
    assert (params["data.since_version_read"], params["data.version_read"]) == ("0", "1")
    assert (tags["data.since_version"], tags["data.version"]) == ("0", "1")
    logged = {i.dataset.name: i.dataset for i in run.inputs.dataset_inputs}
    assert sorted(logged) == ["table@(0,1]:test", "table@(0,1]:train", "table@(0,1]:validation"]
    train_set = logged["table@(0,1]:train"]
    assert json.loads(train_set.profile)["num_rows"] == 160
    assert json.loads(train_set.profile)["since_version"] == 0
    source = json.loads(train_set.source)
    assert (source["delta_table_version"], source["delta_table_since_version"]) == (1, 0)
    # The gate compared it with the champion, and it earned the alias.
    assert f"beats {NAME}@champion (version {before.version})" in tags["keras_dl.gate"]
    # ... on the changed rows, and on the whole test split (the 60 older rows and 40 new).
    whole = f"is no worse than {NAME}@champion (version {before.version}): "
    assert whole in tags["keras_dl.gate"]
    assert "on the whole test split (100 rows, older rows included)" in tags["keras_dl.gate"]
    metrics = run.data.metrics
    assert metrics["full_test_rmse"] <= 1.01 * metrics["champion_full_test_rmse"]
    assert {"test_loss", "champion_test_loss", "champion_full_test_loss"} <= set(metrics)
    assert result.registered_version is not None
    after = client.get_model_version_by_alias(NAME, "champion")
    assert int(after.version) == result.registered_version > int(before.version)


@pytest.mark.slow
def test_a_fine_tune_that_does_not_beat_the_champion_leaves_the_alias(champion, tmp_path):
    tmp, _, client = champion
    before = int(client.get_model_version_by_alias(NAME, "champion").version)
    # The appended training rows say y = -(2 x1 - x2): fitting them makes the model worse on
    # the appended test rows, which still follow y = 2 x1 - x2.
    table = append(champion, tmp_path, rows(160, 40, seed=2, sign=-1.0))
    sets = ["data.since_version=0", f"model.init_from=models:/{NAME}@champion", "train.epochs=3"]
    result = train(table, tmp, f"v1-{tmp_path.name}", *sets, *GATE)

    assert result.registered_version is None
    assert f"does not beat {NAME}@champion (version {before})" in result.not_registered
    assert int(client.get_model_version_by_alias(NAME, "champion").version) == before
    assert client.get_run(result.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_init_from_names_the_layer_and_shapes_that_do_not_fit(champion, tmp_path):
    tmp, table, client = champion
    with pytest.raises(ConfigError) as err:
        train(table, tmp, "mismatch", f"model.init_from=models:/{NAME}/1", "data.features=x1")
    text = str(err.value)
    assert f"model.init_from='models:/{NAME}/1'" in text
    assert "layer " in text and "(1," in text and "(2," in text  # this model's and the registered


@pytest.mark.slow
def test_init_from_an_unknown_alias_or_model_is_a_clear_error(champion, tmp_path):
    tmp, table, _ = champion
    with pytest.raises(KerasDLError, match=rf"Registered model '{NAME}' has no alias 'nope'"):
        train(table, tmp, "nope", f"model.init_from=models:/{NAME}@nope")
    with pytest.raises(KerasDLError, match=r"There is no registered model 'ghost'"):
        train(table, tmp, "ghost", "model.init_from=models:/ghost/1")


@pytest.mark.slow
def test_warm_start_copies_every_weight_of_the_registered_version(champion):
    import keras

    from keras_dl.model.registry import load_keras_model
    from keras_dl.model.warm_start import warm_start

    tmp, _, client = champion
    registered = load_keras_model(f"models:/{NAME}/1")
    fresh = keras.models.clone_model(registered)  # same layers, new random weights
    assert not all(
        np.array_equal(a, b) for a, b in zip(fresh.get_weights(), registered.get_weights())
    )
    lineage = warm_start(fresh, f"models:/{NAME}/1", client.tracking_uri)
    assert (lineage.name, lineage.version) == (NAME, 1)
    for ours, theirs in zip(fresh.get_weights(), registered.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)


class Stop(Exception):
    pass


class Weights(keras.callbacks.Callback):
    """Keeps the weights at the start of fit, and after epoch ``stop_after`` (then stops)."""

    def __init__(self, stop_after=None):
        super().__init__()
        self.stop_after, self.at_start, self.at_stop = stop_after, None, None

    def on_train_begin(self, logs=None):
        self.at_start = self.model.get_weights()

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.stop_after:
            self.at_stop = self.model.get_weights()
            raise Stop


@pytest.mark.slow
def test_a_resumed_fine_tune_continues_from_its_checkpoint_not_from_init_from(champion, tmp_path):
    from keras_dl.model.registry import load_keras_model

    tmp, _, client = champion
    table = append(champion, tmp_path, rows(160, 40, seed=3))
    sets = ["data.since_version=0", f"model.init_from=models:/{NAME}/1", "train.epochs=3"]
    first = Weights(stop_after=1)
    with pytest.raises(Stop):
        train(table, tmp, f"resume-{tmp_path.name}", *sets, callbacks=[first])
    registered = load_keras_model(f"models:/{NAME}/1").get_weights()
    for ours, theirs in zip(first.at_start, registered, strict=True):
        np.testing.assert_array_equal(ours, theirs)  # the fine-tune started from version 1

    again = Weights()
    train(table, tmp, f"resume-{tmp_path.name}", *sets, callbacks=[again])
    # The rerun resumed from the epoch-1 checkpoint: init_from did not overwrite it.
    for ours, theirs in zip(again.at_start, first.at_stop, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def flipped(n_train: int, n_eval: int, seed: int) -> pa.Table:
    """Rows of the other rule, ``y = -(2 x1 - x2)``, on every split: x alone cannot tell them
    from the older rows, so one model cannot fit both."""
    table = rows(n_train, n_eval, seed)
    return table.set_column(table.schema.get_field_index("y"), "y", pc.negate(table["y"]))


@pytest.mark.slow
def test_a_fine_tune_that_forgot_the_older_rows_loses_to_the_champion_on_the_whole_split(
    tmp_path,
):
    """The champion trained on every row of v1: 400 older rows and 80 of the other rule, a
    compromise (about 2/3 of the older rule) that still beats the mean. The fine-tune on the
    changed rows learns the new rule: it beats the champion on the changed test rows, which
    is all the gate compared before, but on the whole test split, older rows included, it is
    far worse. The alias stays, and the reason says where it lost."""
    name = "forget"
    sets = [f"tracking.registered_model={name}", "train.learning_rate=0.01", *GATE]
    table = write_test_table(str(tmp_path / "table"), rows(400, 80, seed=4), rows_per_group=100)
    from deltalake import write_deltalake

    write_deltalake(table, flipped(80, 20, seed=5), mode="append")  # version 1
    champion = train(table, tmp_path, "all", *sets, "train.epochs=10")
    assert champion.registered_version == 1

    fine_tune = ["data.since_version=0", f"model.init_from=models:/{name}@champion"]
    result = train(table, tmp_path, "new", *sets, *fine_tune, "train.epochs=15")

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(result.run_id)
    m, tags = run.data.metrics, run.data.tags
    assert run.info.status == "FINISHED"
    assert run.data.params["data.train_rows"] == "80"  # the changed rows only
    # On the changed test rows (20) it wins; on the whole test split (100) it loses.
    assert m["test_rmse"] < m["champion_test_rmse"]
    assert m["full_test_rmse"] > 1.5 * m["champion_full_test_rmse"]
    assert f"beats {name}@champion (version 1)" in tags["keras_dl.gate"]
    assert result.registered_version is None
    reason = result.not_registered
    assert reason == tags["keras_dl.not_registered"]
    assert (
        f"full_test_rmse^2={m['full_test_rmse'] ** 2:.4g} is worse than {name}@champion " in reason
    )
    assert "on the whole test split (100 rows, older rows included)" in reason
    assert "beyond registry.forgetting_tolerance=0.01" in reason
    assert int(client.get_model_version_by_alias(name, "champion").version) == 1
    # The report shows both figures for both models.
    page = client.download_artifacts(result.run_id, "report.html", str(tmp_path))
    html = Path(page).read_text()
    assert "<th>this model, whole test split</th><th>champion, whole test split</th>" in html
    assert f"<td>rmse</td><td>{m['test_rmse']:.6g}</td>" in html

    # Without a test split the validation split decides: its whole split is compared the same.
    result = train(table, tmp_path, "val", *sets, *fine_tune, "train.epochs=15", "data.test_split=")
    assert result.registered_version is None
    assert "is worse than forget@champion (version 1)" in result.not_registered
    assert "on the whole validation split (100 rows, older rows included)" in result.not_registered
    m = client.get_run(result.run_id).data.metrics
    assert m["full_val_rmse"] > 1.5 * m["champion_full_val_rmse"]
    assert m["champion_val_rmse"] > 0  # the champion on the changed validation rows
