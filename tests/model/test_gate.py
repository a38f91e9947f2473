"""Only a model that earned it reaches the registry: the trivial predictor, registry.min_metric,
registry.must_beat and registry.set_alias, and a training loss that blows up fails the run."""

from __future__ import annotations

import re
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pytest

from keras_dl import cli
from keras_dl.config import parse_min_metric, resolve
from keras_dl.divergence import find_divergence
from keras_dl.errors import ConfigError, DivergenceError
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import HEAVY, run_cli, runs_in, seed_store, train_digits, write_test_table


@pytest.fixture(scope="session")
def small_table(tmp_path_factory) -> str:
    """600 rows (train 400 / validation 100 / test 100) with a learnable regression label ``y``,
    a 90/10 string label ``cls`` that no column predicts, and one, ``rare``, that ``x1`` does."""
    rng = np.random.default_rng(0)
    n = 600
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    table = pa.table(
        {
            "x1": x1,
            "x2": x2,
            "noise": list(rng.normal(size=(n, 16))),
            "y": 2 * x1 - x2 + 0.1 * rng.normal(size=n),
            "ynoise": rng.normal(size=n),
            "cls": np.where(rng.random(n) < 0.1, "b", "a"),
            "rare": np.where(x1 > 1.28, "b", "a"),
            "split": ["train"] * 400 + ["validation"] * 100 + ["test"] * 100,
        }
    )
    path = tmp_path_factory.mktemp("tables") / "small"
    return write_test_table(str(path), table, rows_per_group=50, partition_by=["split"])


def train_tabular(table: str, tmp: Path, *sets: str):
    """Train the tabular recipe on ``table`` into the SQLite store and run folder under ``tmp``."""
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    recipe = load_recipe("tabular")
    exp = resolve(recipe.defaults, sets=[*_sets(table, tmp), *sets])
    result = fit(exp, recipe)
    assert mlflow.active_run() is None
    return result, uri


def _sets(table: str, tmp: Path) -> list[str]:
    return [
        f"data.table={table}",
        "data.split_column=split",
        f"tracking.uri={seed_store(tmp / 'mlflow.db')}",
        f"runtime.run_dir={tmp / 'run'}",
        "train.verbose=0",
    ]


def _versions(uri: str) -> list[int]:
    return sorted(int(v.version) for v in mlflow.MlflowClient(uri).search_model_versions())


@pytest.mark.slow
def test_a_packed_model_is_compared_with_and_warm_started_from_the_logged_champion(
    small_table, tmp_path
):
    """x1 and x2 (float64) train packed; the champion is logged taking them by name. The next
    run's gate feeds it the packed test split unpacked, and warm-starts from its weights."""
    sets = ["data.label=y", "data.features=x1,x2", "train.epochs=5", "registry.set_alias=champion"]
    first, uri = train_tabular(small_table, tmp_path, *sets)
    # The run's model takes x1 and x2 by name, as logged; they are packed inside it.
    assert list(first.model.input) == ["x1", "x2"]
    assert first.model.get_layer("__packed_float64") is not None
    assert first.registered_version == 1
    second, _ = train_tabular(
        small_table,
        tmp_path,
        *sets,
        f"runtime.run_dir={tmp_path / 'second'}",
        "registry.must_beat=champion",
        "model.init_from=models:/tabular@champion",
    )
    client = mlflow.MlflowClient(uri)
    gate = client.get_run(second.run_id).data.tags["keras_dl.gate"]
    assert "could not be evaluated" not in gate
    assert re.search(r"beats? tabular@champion \(version 1\): [0-9.e-]+ on the same rows", gate)
    for version in _versions(uri):
        model = mlflow.pyfunc.load_model(f"models:/tabular/{version}")
        assert [i.name for i in model.metadata.signature.inputs.inputs] == ["x1", "x2"]


@pytest.mark.slow
def test_lr_1e6_on_digits_registers_nothing_and_exits_non_zero(digits_table, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = [
        f"data.table={digits_table}",
        "train.learning_rate=1e6",
        "train.epochs=3",
        f"tracking.uri={uri}",
        f"runtime.run_dir={tmp_path / 'run'}",
    ]
    proc = run_cli("-m", "recipes.digits", *(a for s in sets for a in ("--set", s)), cwd=tmp_path)
    (run,) = runs_in(uri)
    assert _versions(uri) == []
    if proc.returncode == 4:  # trained to a finite loss: the gate refuses it
        assert run.info.status == "FINISHED"
        assert (
            "does not beat the training majority class" in run.data.tags["keras_dl.not_registered"]
        )
        assert "error: The model was not registered as digits" in proc.stderr
    else:  # or the loss blew up: diverged
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert run.info.status == "FAILED"
        assert run.data.tags["keras_dl.failure"] == "diverged"


def test_a_float32_metric_equal_to_the_majority_baseline_ties_and_does_not_beat_it():
    """Found when a digits model at lr=1e6 collapsed to the majority class 3 and was registered:
    Keras' float32 accuracy 37/360 = 0.10277778 was read as above the exact 0.1027777..."""
    from keras_dl.model.gate import Score, _against_trivial

    score = Score("test_accuracy", float(np.float32(37 / 360)), True, "classification")
    train = np.array([3] * 40 + [1] * 30 + [2] * 30)
    rows = np.array([3] * 37 + [1] * 323)  # the majority class 3 hits 37 of 360
    ok, text = _against_trivial(score, train, rows)
    assert not ok and "does not beat the training majority class 3" in text
    assert Score("test_accuracy", 38 / 360, True, "classification").beats(37 / 360)  # one more hit
    loss = Score("test_mse", float(np.float32(0.3)), False, "regression")
    assert not loss.beats(0.3) and loss.beats(0.31)


def test_no_worse_allows_the_tolerance_relative_to_the_champion_and_float32_ties():
    from keras_dl.model.gate import Score

    mse = Score("full_test_mse", 2.02, False, "regression")
    assert mse.no_worse(2.0, 0.01) and not mse.no_worse(2.0, 0.005)
    accuracy = Score("full_test_accuracy", 0.891, True, "classification")
    assert accuracy.no_worse(0.9, 0.01) and not accuracy.no_worse(0.9, 0.005)
    tie = Score("full_test_accuracy", float(np.float32(0.3)), True, "classification")
    assert tie.no_worse(0.3, 0.0) and not tie.beats(0.3)


@pytest.mark.slow  # 53 s on 2 cores
def test_a_model_no_better_than_the_majority_class_is_not_registered(small_table, tmp_path):
    sets = ["data.label=cls", "data.features=noise", "train.epochs=5"]
    args = [a for s in [*_sets(small_table, tmp_path), *sets] for a in ("--set", s)]
    assert cli.main(["train", "tabular", *args]) == 4
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    reason = run.data.tags["keras_dl.not_registered"]
    # "a" is class 0 to the model (the recipe maps the strings): the same accuracy either way.
    assert "does not beat the training majority class 'a'" in reason
    assert "on the same 100 rows" in reason
    assert run.data.metrics["test_accuracy"] <= 0.95
    assert _versions(uri) == []

    # The same command again trains nothing and decides the same, in the same run.
    result, _ = train_tabular(small_table, tmp_path, *sets)
    assert result.history == {}
    assert result.run_id == run.info.run_id
    assert result.registered_version is None
    assert result.not_registered == reason
    assert _versions(uri) == []


@pytest.mark.slow
def test_a_floor_holds_a_good_model_back_until_it_is_met(small_table, tmp_path):
    sets = ["data.label=rare", "data.features=x1,x2", "train.epochs=20"]
    sets += ["train.learning_rate=0.01"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ConfigError, match=r"names 'test_f1'.*test_accuracy, test_loss"):
        train_tabular(small_table, tmp_path, *sets, "registry.min_metric=test_f1>=0.5")
    (run,) = runs_in(uri)
    assert run.info.status == "FAILED"

    result, _ = train_tabular(small_table, tmp_path, *sets, "registry.min_metric=test_accuracy>1")
    assert result.history == {} and result.run_id == run.info.run_id  # trained once only
    assert "fails test_accuracy>1" in result.not_registered
    assert _versions(uri) == []

    result, _ = train_tabular(
        small_table, tmp_path, *sets, "registry.min_metric=test_accuracy>=0.9"
    )
    assert result.history == {} and result.registered_version == 1
    assert result.not_registered is None
    (run,) = runs_in(uri)
    assert run.info.status == "FINISHED"
    assert "keras_dl.not_registered" not in run.data.tags
    gate = run.data.tags["keras_dl.gate"]
    assert "meets test_accuracy>=0.9" in gate and "beats the training majority class 'a'" in gate
    version = mlflow.MlflowClient(uri).get_model_version("tabular", "1")
    assert version.tags["keras_dl.gate"] == gate
    assert (tmp_path / "run" / "checkpoints" / "COMPLETE").exists()


@pytest.mark.slow
def test_without_a_test_split_the_validation_split_decides(small_table, tmp_path):
    sets = ["data.label=rare", "data.features=x1,x2", "data.test_split=", "train.epochs=20"]
    sets += ["train.learning_rate=0.01", "registry.min_metric=val_accuracy>=0.9"]
    result, uri = train_tabular(small_table, tmp_path, *sets)
    assert result.registered_version == 1 and result.metrics == {}
    gate = mlflow.MlflowClient(uri).get_run(result.run_id).data.tags["keras_dl.gate"]
    assert "meets val_accuracy>=0.9" in gate
    assert "beats the training majority class 'a'" in gate and "same 100 rows" in gate


@pytest.mark.slow
def test_must_beat_the_champion_and_set_alias_moves_it(digits_table, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    gate = ("registry.must_beat=champion", "registry.set_alias=champion", f"tracking.uri={uri}")

    def train(name: str, epochs: int):
        run_dir = f"runtime.run_dir={tmp_path / name}"
        return train_digits(digits_table, tmp_path, f"train.epochs={epochs}", run_dir, *gate)[1]

    weak = train("weak", 1)  # no champion yet: it only has to beat the majority class
    assert weak.registered_version == 1
    assert (
        "no version of 'digits' holds @champion yet"
        in client.get_run(weak.run_id).data.tags["keras_dl.gate"]
    )
    assert int(client.get_model_version_by_alias("digits", "champion").version) == 1

    strong = train("strong", 4)
    assert strong.registered_version == 2
    assert strong.metrics["test_accuracy"] > weak.metrics["test_accuracy"]
    assert (
        "beats digits@champion (version 1)"
        in client.get_run(strong.run_id).data.tags["keras_dl.gate"]
    )
    assert int(client.get_model_version_by_alias("digits", "champion").version) == 2

    again = train("again", 1)
    assert again.registered_version is None
    assert "does not beat digits@champion (version 2)" in again.not_registered
    assert client.get_run(again.run_id).info.status == "FINISHED"
    assert _versions(uri) == [1, 2]
    assert int(client.get_model_version_by_alias("digits", "champion").version) == 2


@pytest.mark.slow
def test_regression_must_beat_predicting_the_training_mean(small_table, tmp_path):
    good, uri = train_tabular(
        small_table, tmp_path / "good", "data.label=y", "data.features=x1,x2", "train.epochs=10"
    )
    assert good.registered_version == 1
    tags = mlflow.MlflowClient(uri).get_run(good.run_id).data.tags
    assert "test_rmse^2=" in tags["keras_dl.gate"]
    assert "beats predicting the training mean" in tags["keras_dl.gate"]

    # Noise memorized: worse than the mean on unseen rows.
    bad, uri = train_tabular(
        small_table,
        tmp_path / "bad",
        "data.label=ynoise",
        "data.features=noise",
        "train.epochs=40",
        "model.hidden=128,128",
        "model.dropout=0",
        "train.learning_rate=0.01",
    )
    assert "does not beat predicting the training mean" in bad.not_registered
    assert _versions(uri) == []


@pytest.mark.slow
def test_a_growing_loss_fails_the_run_early_and_the_factor_can_be_turned_off(small_table, tmp_path):
    # A linear model under SGD past its stable step size: the loss grows every step.
    sets = ["data.label=y", "data.features=x1,x2", "model.hidden=", "train.optimizer=sgd"]
    sets += ["train.learning_rate=0.25", "train.epochs=20"]
    with pytest.raises(
        DivergenceError, match=r"loss grew from .* callbacks.divergence_factor=10 times"
    ):
        train_tabular(small_table, tmp_path / "on", *sets)
    uri = f"sqlite:///{tmp_path / 'on' / 'mlflow.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"] == "diverged"
    assert run.data.tags["keras_dl.failure_reason"].startswith("DivergenceError: Training diverged")
    assert run.data.params["early_stopping.reason"] == "diverged"
    epochs = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "loss")
    assert 2 <= len(epochs) < 20  # stopped at the epoch that grew, not after 20
    assert _versions(uri) == []
    # The failed run has its report: the curves up to the epoch that grew, and why it ended.
    client = mlflow.MlflowClient(uri)
    page = client.download_artifacts(run.info.run_id, "report.html", str(tmp_path))
    html = Path(page).read_text()
    assert "<td>status</td><td>FAILED</td>" in html
    assert "<td>failure</td><td>diverged: DivergenceError: Training diverged" in html
    assert 'data-series="loss"' in html

    # Off: both divergence rules on the loss (by epoch 2 it is also 100 times the mean's).
    off, uri = train_tabular(
        small_table,
        tmp_path / "off",
        *sets,
        "train.epochs=3",
        "callbacks.divergence_factor=0",
        "callbacks.trivial_loss_factor=0",
    )
    assert len(off.history["loss"]) == 3
    assert off.history["loss"][-1] > 10 * off.history["loss"][0]
    assert "does not beat predicting the training mean" in off.not_registered


@pytest.mark.slow
@HEAVY
def test_every_horovod_rank_stops_at_the_epoch_whose_averaged_loss_grew(small_table, tmp_path):
    from keras_dl.errors import DistributedError
    from keras_dl.launch import launch

    sets = ["data.label=y", "data.features=x1,x2", "model.hidden=", "train.optimizer=sgd"]
    sets += ["train.learning_rate=0.25", "train.epochs=20"]
    sets += ["runtime.strategy=horovod", "runtime.np=-2", "runtime.stall_timeout=60"]
    # The growth rule alone: on two ranks the first epoch's loss (8.6e3) is already past 100
    # times the mean's (4.6), where callbacks.trivial_loss_factor would stop it first.
    sets += ["callbacks.trivial_loss_factor=0"]
    exp = resolve(load_recipe("tabular").defaults, sets=[*_sets(small_table, tmp_path), *sets])
    # Both ranks stop after the same epoch and fail alike; a rank left training alone would
    # wait in the next allreduce until the stall timeout named it instead.
    with pytest.raises(
        (DivergenceError, DistributedError), match=r"DivergenceError: Training diverged: loss grew"
    ):
        launch(exp)
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"] == "diverged"
    assert "Training diverged: loss grew" in run.data.tags["keras_dl.failure_reason"]
    epochs = mlflow.MlflowClient(exp.tracking.uri).get_metric_history(run.info.run_id, "loss")
    assert 2 <= len(epochs) < 20
    assert _versions(exp.tracking.uri) == []


@pytest.mark.slow
@HEAVY
def test_every_horovod_rank_stops_at_the_epoch_whose_averaged_loss_is_past_the_trivial(
    small_table, tmp_path
):
    from keras_dl.errors import DistributedError
    from keras_dl.launch import launch

    sets = ["data.label=y", "data.features=x1,x2", "model.hidden=", "train.optimizer=sgd"]
    sets += ["train.learning_rate=0.25", "train.epochs=20"]
    sets += ["runtime.strategy=horovod", "runtime.np=-2", "runtime.stall_timeout=60"]
    exp = resolve(load_recipe("tabular").defaults, sets=[*_sets(small_table, tmp_path), *sets])
    # Every rank computes the same figure from the whole training split's labels and compares
    # the ranks' averaged loss with it: all stop after the same epoch.
    with pytest.raises(
        (DivergenceError, DistributedError),
        match=r"DivergenceError: Training diverged: loss .* callbacks.trivial_loss_factor=100",
    ):
        launch(exp)
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"] == "diverged"
    epochs = mlflow.MlflowClient(exp.tracking.uri).get_metric_history(run.info.run_id, "loss")
    assert 1 <= len(epochs) < 20
    assert _versions(exp.tracking.uri) == []


def test_early_stopping_stops_at_the_epoch_whose_loss_grew():
    import keras

    from keras_dl.callbacks import EarlyStopping

    x, y = np.ones((32, 1), "float32"), np.zeros((32, 1), "float32")

    def fit_with(factor: float):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        model.compile(keras.optimizers.SGD(1.2), "mse")  # each step multiplies w by -1.4
        stop = EarlyStopping(monitor="loss", divergence_factor=factor, verbose=False)
        history = model.fit(x, y, batch_size=8, epochs=6, callbacks=[stop], verbose=0)
        return stop, history.history["loss"]

    stop, losses = fit_with(10.0)
    assert stop.stop_reason == "diverged" and len(losses) == 2
    assert losses[1] > 10 * losses[0]
    stop, losses = fit_with(0.0)
    assert stop.stop_reason == "completed" and len(losses) == 6


def test_find_divergence_compares_with_the_first_epoch():
    assert "grew from 1 in the first epoch to 20 at epoch 3" in find_divergence(
        history={"loss": [1.0, 5.0, 20.0]}, factor=10
    )
    assert find_divergence(history={"loss": [1.0, 5.0, 20.0]}, factor=0) is None
    assert find_divergence(history={"loss": [100.0, 5.0, 999.0]}, factor=10) is None
    assert "not finite" in find_divergence(history={"loss": [1.0, float("inf")]}, factor=10)


@pytest.mark.parametrize(
    "item, match",
    [
        ("registry.min_metric=test_accuracy", r"is not NAME OP NUMBER"),
        ("registry.min_metric=test_accuracy>=high", r"is not NAME OP NUMBER"),
        ("registry.min_metric=>=0.9", r"is not NAME OP NUMBER"),
        ("registry.must_beat=latest", r"registry.must_beat='latest' is not a valid alias"),
        ("registry.set_alias=9lives", r"registry.set_alias='9lives' is not a valid alias"),
        ("callbacks.divergence_factor=0.5", r"must be 0 \(off\) or greater than 1"),
        (
            "registry.forgetting_tolerance=1",
            r"forgetting_tolerance=1(\.0)? is outside the allowed range \[0, 1\)",
        ),
        (
            "registry.forgetting_tolerance=-0.1",
            r"forgetting_tolerance=-0.1 is outside the allowed range \[0, 1\)",
        ),
        ("registry.floor=1", r"Unknown config key 'registry.floor'"),
    ],
)
def test_registry_settings_are_checked_at_load(digits_table, item, match):
    recipe = load_recipe("digits")
    with pytest.raises(ConfigError, match=match):
        resolve(recipe.defaults, sets=[f"data.table={digits_table}", item])


def test_min_metric_parses_name_op_number():
    assert parse_min_metric("test_accuracy>=0.95") == ("test_accuracy", ">=", 0.95)
    assert parse_min_metric(" val_loss < 0.3 ") == ("val_loss", "<", 0.3)
    assert parse_min_metric("test_rmse<=1e-2") == ("test_rmse", "<=", 0.01)
