"""Divergence fails the run: a NaN model never reaches MLflow's registry."""

from __future__ import annotations

import mlflow
import pytest

from keras_dl.config import resolve
from keras_dl.errors import ConfigError, DivergenceError
from keras_dl.recipe import load_recipe
from tests.conftest import runs_in, train_digits


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
        ("train.learning_rate=-1", r"train.learning_rate must be a finite number > 0"),
        ("train.epochs=0", r"train.epochs must be >= 1"),
        ("runtime.warmup_epochs=nan", r"runtime.warmup_epochs must be a finite number"),
        ("callbacks.min_delta=nan", r"callbacks.min_delta must be a finite number"),
        ("data.shuffle_buffer=0", r"data.shuffle_buffer must be >= 1"),
        (
            "callbacks.checkpoint_every_n_steps=-1",
            r"callbacks.checkpoint_every_n_steps must be >= 0",
        ),
        ("model.dropout=nan", r"model.dropout must be a finite number"),
    ],
)
def test_values_no_training_could_use_are_refused_at_load(digits_table, item, match):
    recipe = load_recipe("digits")
    with pytest.raises(ConfigError, match=match):
        resolve(recipe.defaults, sets=[f"data.table={digits_table}", item])
