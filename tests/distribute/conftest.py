"""Shared setup for the distributed tests: a resolved digits experiment on a fresh store."""

from __future__ import annotations

import pytest

from keras_dl.config import resolve
from keras_dl.recipe import load_recipe


def digits_experiment(table: str, tmp, *sets: str):
    """The digits recipe, small and quick: 4 epochs, no validation split, no plots, its own
    MLflow store."""
    return resolve(
        load_recipe("digits").defaults,
        sets=[
            f"data.table={table}",
            "data.validation_split=",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
            f"runtime.run_dir={tmp / 'run'}",
            "train.epochs=4",
            "train.verbose=0",
            "callbacks.plots=false",
            *sets,
        ],
    )


@pytest.fixture
def digits_exp(digits_table, tmp_path):
    """``fn(*sets)`` -> the small digits experiment with extra ``--set`` overrides."""
    return lambda *sets: digits_experiment(digits_table, tmp_path, *sets)
