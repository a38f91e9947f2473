"""Divergence fails the run: a NaN model never reaches MLflow's registry."""

from __future__ import annotations

import math

import mlflow
import numpy as np
import pytest

from keras_dl.config import resolve
from keras_dl.errors import ConfigError, DivergenceError
from keras_dl.recipe import load_recipe
from tests.conftest import run_cli, runs_in, train_digits


@pytest.mark.slow
def test_a_diverging_run_fails_with_its_reason_and_registers_nothing(digits_table, tmp_path):
    # 1e30 is finite and positive, so the config accepts it; the weights then overflow.
    with pytest.raises(DivergenceError, match=r"not finite.*train.learning_rate=1e\+30"):
        train_digits(digits_table, tmp_path, "train.learning_rate=1e30", "train.epochs=2")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (run,) = runs_in(uri)
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"] == "diverged"
    assert "not finite" in run.data.tags["keras_dl.failure_reason"]
    assert "model" not in {a.path for a in mlflow.MlflowClient(uri).list_artifacts(run.info.run_id)}
    assert mlflow.MlflowClient(uri).search_registered_models() == []
    assert mlflow.active_run() is None


@pytest.mark.parametrize(
    "item, match",
    [
        ("train.learning_rate=nan", r"train.learning_rate must be a finite number, got nan"),
        ("train.learning_rate=inf", r"train.learning_rate must be a finite number, got inf"),
        ("train.learning_rate=-1", r"train.learning_rate=-1.0 is outside the allowed range > 0"),
        ("train.epochs=0", r"train.epochs=0 is outside the allowed range >= 1"),
        ("runtime.warmup_epochs=nan", r"runtime.warmup_epochs must be a finite number"),
        ("callbacks.min_delta=nan", r"callbacks.min_delta must be a finite number"),
        ("data.shuffle_buffer=0", r"data.shuffle_buffer=0 is outside the allowed range >= 1"),
        (
            "callbacks.checkpoint_every_n_steps=-1",
            r"callbacks.checkpoint_every_n_steps=-1 is outside the allowed range >= 0",
        ),
        ("model.dropout=nan", r"model.dropout must be a finite number"),
        (
            "callbacks.trivial_loss_factor=0.5",
            r"callbacks.trivial_loss_factor=0.5 must be 0 \(off\) or greater than 1",
        ),
    ],
)
def test_values_no_training_could_use_are_refused_at_load(digits_table, item, match):
    recipe = load_recipe("digits")
    with pytest.raises(ConfigError, match=match):
        resolve(recipe.defaults, sets=[f"data.table={digits_table}", item])


@pytest.mark.slow
def test_an_exploding_start_that_then_falls_fails_the_run_as_diverged(digits_table, tmp_path):
    """At train.learning_rate=1e6 the loss starts near 1.8e20 and falls: it never grows past
    callbacks.divergence_factor times the first epoch's, but it is far above the trivial
    predictor's (ln 10 for ten balanced classes)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = [
        f"data.table={digits_table}",
        "train.learning_rate=1e6",
        "train.epochs=3",
        f"tracking.uri={uri}",
        f"runtime.run_dir={tmp_path / 'run'}",
    ]
    proc = run_cli("-m", "recipes.digits", *(a for s in sets for a in ("--set", s)), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "callbacks.trivial_loss_factor=100 times the trivial predictor's" in proc.stderr
    (run,) = runs_in(uri)
    assert run.info.status == "FAILED"
    assert run.data.tags["keras_dl.failure"] == "diverged"
    reason = run.data.tags["keras_dl.failure_reason"]
    assert reason.startswith("DivergenceError: Training diverged: loss ")
    assert "at epoch 1 is more than callbacks.trivial_loss_factor=100 times" in reason
    assert run.data.params["early_stopping.reason"] == "diverged"
    assert float(run.data.params["divergence.trivial_loss"]) == pytest.approx(math.log(10), 1e-3)
    client = mlflow.MlflowClient(uri)
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 1  # stopped after epoch 1
    assert client.search_registered_models() == []


def test_the_trivial_loss_is_the_training_labels_entropy_or_spread():
    from keras_dl.trivial import loss_name, loss_of_trivial

    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    p = np.array([0.5, 0.3, 0.2])
    got = loss_of_trivial("sparse_categorical_crossentropy", labels)
    assert got.predictor == pytest.approx(-(p * np.log(p)).sum())
    assert got.uninformed == pytest.approx(math.log(3))
    assert got.value == max(got.predictor, got.uninformed)
    assert "predicting the training class frequencies scores 1.03" in got.what
    # One-hot labels, the same frequencies.
    onehot = np.eye(3)[labels]
    assert loss_of_trivial("categorical_crossentropy", onehot).predictor == pytest.approx(
        got.predictor
    )
    # A skewed label's entropy is small: an uninformed output (uniform over 10 outputs) counts.
    skewed = loss_of_trivial("sparse_categorical_crossentropy", np.array([0] * 999 + [1]), width=10)
    assert skewed.predictor < 0.01 and skewed.value == pytest.approx(math.log(10))
    binary = loss_of_trivial("binary_crossentropy", np.array([1.0] * 25 + [0.0] * 75))
    assert binary.predictor == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # Regression: the mean's MSE is the variance, its MAE the mean absolute deviation; beside
    # them predicting 0 (a fresh model's start) scores the mean square / mean absolute value.
    y = np.array([1.0, 2.0, 3.0, 6.0])
    mse = loss_of_trivial("mean_squared_error", y)
    assert (mse.predictor, mse.uninformed, mse.value) == pytest.approx((3.5, 12.5, 12.5))
    assert "predicting the training mean scores 3.5" in mse.what
    assert loss_of_trivial("mae", y).predictor == pytest.approx(1.5)
    assert loss_of_trivial("mae", y - 3).value == pytest.approx(1.5)  # centred: the mean's
    # Rows weigh as in training: the mean of weighted losses.
    w = np.array([2.0, 2.0, 2.0, 2.0])
    assert loss_of_trivial("mse", y, w).predictor == pytest.approx(7.0)
    # Known names, as strings, Keras losses and loss functions; others are unknown.
    import keras

    assert loss_name("sparse_categorical_crossentropy") == "sparse_categorical_crossentropy"
    assert loss_name(keras.losses.MeanSquaredError()) == "mean_squared_error"
    assert loss_name(keras.losses.mean_absolute_error) == "mean_absolute_error"
    assert loss_name(keras.losses.Huber()) is None
    assert loss_name(keras.losses.CategoricalCrossentropy(label_smoothing=0.1)) is None


def test_find_divergence_compares_every_epoch_with_the_trivial_loss():
    from keras_dl.divergence import find_divergence
    from keras_dl.trivial import TrivialLoss

    trivial = TrivialLoss(2.3, "predicting the training class frequencies, loss 2.3")
    falling = {"loss": [1.8e20, 4e17, 1e16]}
    assert find_divergence(history=falling, factor=10) is None  # the growth rule never trips
    reason = find_divergence(history=falling, factor=10, trivial=trivial, trivial_factor=100)
    assert "loss 1.8e+20 at epoch 1 is more than callbacks.trivial_loss_factor=100" in reason
    assert find_divergence(history=falling, trivial=trivial, trivial_factor=0) is None
    unknown = TrivialLoss(None, "no trivial loss is known for loss 'huber'")
    assert find_divergence(history=falling, trivial=unknown, trivial_factor=100) is None
    healthy = {"loss": [2.2, 1.0, 0.4]}
    assert find_divergence(history=healthy, trivial=trivial, trivial_factor=100) is None


def test_the_trivial_loss_reads_the_training_labels_and_weighs_rows_as_training(tmp_path):
    """Through the run's own reader: the training split's labels (not the test rows), each
    row's weight column value times its class weight."""
    import keras
    import pyarrow as pa

    from keras_dl.config import DataConfig
    from keras_dl.data.splits import make_splits
    from keras_dl.trivial import trivial_loss
    from tests.conftest import write_test_table

    labels = [0] * 60 + [1] * 20 + [1] * 20  # the test rows are all class 1
    weights = [1.0] * 60 + [3.0] * 20 + [1.0] * 20
    table = pa.table(
        {
            "x": np.arange(100, dtype="float32"),
            "y": labels,
            "w": weights,
            "split": ["train"] * 80 + ["test"] * 20,
        }
    )
    path = write_test_table(str(tmp_path / "t"), table, rows_per_group=25)
    config = DataConfig(
        table=path, label="y", features=("x",), split_column="split", weight_column="w"
    )
    data = make_splits(config, batch_size=16, class_weight=("0:2",))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    got = trivial_loss(model, data.train, data.plan)
    # Frequencies 0.75 / 0.25; class 0 weighs 2 (class weight), class 1 weighs 3 (column).
    expected = (60 * 2 * -math.log(0.75) + 20 * 3 * -math.log(0.25)) / 80
    assert got.predictor == pytest.approx(expected)
    # An uninformed output (0.5, 0.5) scores ln 2 a row, weighed alike: the larger here.
    uninformed = (60 * 2 + 20 * 3) / 80 * math.log(2)
    assert got.uninformed == pytest.approx(uninformed) and got.value == got.uninformed
    model.compile("sgd", keras.losses.Huber())
    unknown = trivial_loss(model, data.train, data.plan)
    assert (
        unknown.value is None and "no trivial loss is known for loss 'huber_loss'" in unknown.what
    )
