"""Batch size, epochs and early stopping from the training rows (keras_dl.model.sizing), as the tabular
recipe uses them: the rule on tiny and larger tables, what the user set kept, and the chosen
values in the run's params and config.yaml."""

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from keras_dl.model import sizing
from keras_dl.model.sizing import Sizing, choose_sizes
from keras_dl.recipe import configure, load_recipe
from tests.conftest import write_test_table


@pytest.mark.parametrize(
    "rows, want",
    [
        # 30/16 rounds to 2, raised to 8; 4 steps an epoch: 750 epochs capped at 300.
        (30, Sizing(30, 8, 300, 20, True)),
        # 150/16 = 9.4 -> 8; 19 steps an epoch; 3000/19 -> 158 epochs; patience 158/10.
        (150, Sizing(150, 8, 158, 15, True)),
        # 5000/16 = 312 -> 256; 20 steps an epoch; 150 epochs.
        (5000, Sizing(5000, 256, 150, 15, True)),
        # Big tables: the largest batch and the fewest epochs, with the least patience.
        (1_000_000, Sizing(1_000_000, 256, 10, 5, True)),
    ],
)
def test_the_rule_on_small_and_larger_tables(rows, want):
    assert choose_sizes(rows, validation=True) == want


def test_without_a_validation_split_there_is_no_early_stopping():
    assert choose_sizes(150, validation=False) == Sizing(150, 8, 158, None, False)


def test_what_the_user_set_is_kept():
    assert choose_sizes(150, True, batch_size=100, epochs=3) == Sizing(150, 100, 3, None, False)
    # A set batch size: the epochs come from it; the user's patience stays theirs.
    assert choose_sizes(150, True, batch_size=50, patience=2) == Sizing(150, 50, 300, 2, False)
    # Set epochs: the batch is chosen, and no early stopping is added.
    assert choose_sizes(5000, True, epochs=7) == Sizing(5000, 256, 7, None, False)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(0, 10**10),
    processes=st.integers(1, 16),
    validation=st.booleans(),
)
def test_the_rule_stays_in_its_bounds(rows, processes, validation):
    s = choose_sizes(rows, validation, processes=processes)
    assert s.batch_size % processes == 0
    assert sizing.MIN_BATCH <= s.batch_size < sizing.MAX_BATCH + processes
    if processes == 1:
        assert s.batch_size & (s.batch_size - 1) == 0  # a power of two
    assert sizing.MIN_EPOCHS <= s.epochs <= sizing.MAX_EPOCHS
    steps = s.epochs * max(1, math.ceil(rows / s.batch_size))
    assert steps >= sizing.TARGET_STEPS or s.epochs == sizing.MAX_EPOCHS
    assert (s.patience is not None) == validation == s.restore_best_weights
    if validation:
        assert sizing.MIN_PATIENCE <= s.patience <= sizing.MAX_PATIENCE


def _columns(rows: int, split: bool = True) -> dict:
    rng = np.random.default_rng(0)
    columns = {"x": rng.normal(size=rows), "label": rng.integers(0, 2, rows)}
    if split:  # every 5th row validation: a column, not a partition (a row filter)
        columns["split"] = np.where(np.arange(rows) % 5 == 0, "validation", "train")
    return columns


def _table(path, rows: int, split: bool = True) -> str:
    return write_test_table(str(path), pa.table(_columns(rows, split)), rows_per_group=64)


def _exp(table, *sets):
    return resolve(load_recipe("tabular").defaults, sets=[f"data.table={table}", *sets])


def test_tabular_fills_in_from_the_training_rows_of_a_real_table(tmp_path, capsys):
    table = _table(tmp_path / "t", 150)  # 120 train, 30 validation
    exp = configure(_exp(table, "data.split_column=split"), load_recipe("tabular"))
    assert (exp.train.batch_size, exp.train.epochs) == (8, 200)  # 15 steps an epoch
    assert (exp.callbacks.patience, exp.callbacks.restore_best_weights) == (20, True)
    assert exp.callbacks.monitor == "val_loss"
    out = capsys.readouterr().out
    assert "120 training rows" in out and "train.batch_size=8" in out and "patience=20" in out
    # Filled in once: a second pass changes nothing (the Horovod launcher, then fit).
    assert configure(exp, load_recipe("tabular")) == exp


@pytest.mark.parametrize("strategy", ["horovod", "multiworker"])
def test_the_chosen_batch_is_a_multiple_of_the_launched_processes(tmp_path, strategy):
    """With the multi-worker strategy the driver chose as if for one process: 8 rows over
    3 workers."""
    table = _table(tmp_path / "t", 150)  # 120 train: a batch of 8 for one process
    sets = ("data.split_column=split", f"runtime.strategy={strategy}", "runtime.np=-3")
    exp = configure(_exp(table, *sets), load_recipe("tabular"))
    assert exp.train.batch_size == 9  # 8 rounded up to a multiple of 3


def test_tabular_counts_rows_after_filters_and_without_a_split(tmp_path):
    table = _table(tmp_path / "t", 30, split=False)
    exp = configure(_exp(table), load_recipe("tabular"))
    assert (exp.train.batch_size, exp.train.epochs, exp.callbacks.patience) == (8, 300, None)
    assert exp.callbacks.restore_best_weights is False
    big = _table(tmp_path / "big", 2000)
    exp = configure(
        _exp(big, "data.split_column=split", "data.filters=x > 0"), load_recipe("tabular")
    )
    columns = _columns(2000)
    train = int(((columns["split"] == "train") & (columns["x"] > 0)).sum())
    assert sizing.count_split_rows(exp.data) == (train, int((columns["x"][::5] > 0).sum()))
    assert exp.train.batch_size == 2 ** round(math.log2(train / 16)) == 64


def test_a_user_set_batch_size_and_epochs_are_kept(tmp_path):
    table = _table(tmp_path / "t", 150)
    sets = ("data.split_column=split", "train.batch_size=64", "train.epochs=20")
    exp = _exp(table, *sets)
    assert configure(exp, load_recipe("tabular")) == exp  # nothing chosen, no early stopping
    exp = _exp(table, "data.split_column=split", "train.batch_size=16")
    filled = configure(exp, load_recipe("tabular"))
    assert filled.train.batch_size == 16 and filled.train.epochs == 300  # 8 steps an epoch
    # A YAML file sets them as well as --set does.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  epochs: 4\n  batch_size: 128\n")
    exp = resolve(load_recipe("tabular").defaults, cfg, [f"data.table={table}"])
    assert configure(exp, load_recipe("tabular")).train == exp.train


def test_null_is_only_for_recipes_that_choose_the_value(tmp_path):
    digits = load_recipe("digits").defaults
    with pytest.raises(ConfigError, match=r"'train.batch_size' got 'null'.*recipe 'digits'"):
        resolve(digits, sets=["data.table=/t", "train.batch_size=null"])
    # In the tabular recipe a later null (e.g. after a YAML file's number) means "choose it".
    exp = _exp(tmp_path / "t", "train.epochs=5", "train.epochs=null")
    assert exp.train.epochs is None
    # A recipe that leaves it null with no rule to choose it is refused before training.
    bare = dataclasses.replace(load_recipe("tabular"), configure=None)
    with pytest.raises(ConfigError, match=r"train.epochs is null and recipe 'tabular'"):
        configure(exp, bare)


@pytest.mark.slow
def test_the_chosen_values_are_the_runs_params_and_config(tmp_path, mlflow_uri):
    """Through fit: the run's params and config.yaml hold the chosen batch size."""
    import mlflow

    from keras_dl.train import fit

    table = _table(tmp_path / "t", 40)
    run_dir = tmp_path / "run"
    exp = _exp(
        table,
        "data.split_column=split",
        "train.epochs=2",  # set: kept, and no early stopping is added
        "train.verbose=0",
        f"tracking.uri={mlflow_uri}",
        f"runtime.run_dir={run_dir}",
        "tracking.registered_model=none",
    )
    result = fit(exp)
    params = mlflow.MlflowClient(mlflow_uri).get_run(result.run_id).data.params
    assert params["train.batch_size"] == "8" and params["train.epochs"] == "2"
    assert params["callbacks.patience"] == "" and params["train.steps_per_epoch"] == "4"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["train"]["batch_size"] == 8 and saved["callbacks"]["patience"] is None
    assert len(result.history["loss"]) == 2
