"""The default callbacks built from a run, and which MLflow run a rerun in a run folder continues."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from keras_dl.callbacks import (
    Checkpoint,
    EarlyStopping,
    MLflowLogger,
    Plots,
    ProgressBar,
    SystemMetrics,
    Throughput,
)
from keras_dl.callbacks.checkpoint import COMPLETE, SaveAtEpochEnd, list_checkpoints, read_header
from keras_dl.callbacks.preemption import Preemption
from keras_dl.callbacks.rows_trained import RowsTrained
from keras_dl.callbacks.tensorboard import RunTensorBoard
from keras_dl.checkpoints import Checkpoints
from keras_dl.config import resolve
from keras_dl.data.splits import make_splits
from keras_dl.distribute.world import World
from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from keras_dl.run import RunFolder, config_fingerprint, make_callbacks, open_run
from keras_dl.run import resume_run_id as _resume
from tests.callbacks.helpers import tiny_model


def _exp(table, tmp_path, *sets):
    recipe = load_recipe("digits")
    base = [
        f"data.table={table}",
        f"runtime.run_dir={tmp_path / 'run'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]
    return recipe, resolve(recipe.defaults, sets=[*base, *sets])


def _run(exp, world, run_id):
    run = open_run(exp, world, lock_run_dir=False)
    run.run_id = run_id
    return run


def record_run_id(exp, run_id):
    RunFolder(exp.runtime.run_dir).record_run_id(run_id, exp.tracking.uri)


def resume_run_id(exp):
    return _resume(exp, RunFolder(exp.runtime.run_dir))


def checkpoint_dir(exp):
    return Path(RunFolder(exp.runtime.run_dir).checkpoints.uri)


def test_config_keys_reach_the_callbacks_in_their_order(digits_table, tmp_path):
    recipe, exp = _exp(
        digits_table,
        tmp_path,
        "callbacks.patience=4",
        "callbacks.stopping_threshold=0.2",
        "callbacks.divergence_threshold=9",
        "callbacks.mode=min",
        "callbacks.checkpoint_every_n_steps=7",
        "callbacks.keep_checkpoints=5",
        "callbacks.log_every_n_steps=3",
        "runtime.resume=false",
        "train.verbose=1",
        "tracking.tensorboard=true",
    )
    data = make_splits(exp.data, 32, accept=recipe.accept, preprocess=recipe.preprocess)
    cbs = make_callbacks(_run(exp, World(), "run-1"), data)
    assert [type(c) for c in cbs] == [
        Checkpoint,
        RowsTrained,
        EarlyStopping,
        Throughput,
        SystemMetrics,
        SaveAtEpochEnd,
        MLflowLogger,
        Plots,
        RunTensorBoard,
        ProgressBar,
        Preemption,
    ]
    ckpt, rows, stop, tp, system, save, logger, plots, tensorboard, bar, preemption = cbs
    # The epoch's checkpoint is written once its logs are whole (rows_trained, throughput),
    # so the header a resumed run backfills from holds them all; and before MLflow gets them,
    # so an epoch whose checkpoint a full disk refused is not logged twice (test_disk_full).
    assert save.checkpoint is ckpt and ckpt.save_at_epoch_end is False
    # The run holds them by name, the ones train.py and prepare_fit reach for.
    assert (cbs.checkpoint, cbs.rows_trained, cbs.early_stopping) == (ckpt, rows, stop)
    assert (cbs.throughput, cbs.system_metrics, cbs.logger) == (tp, system, logger)
    assert cbs.ordered(["mine"])[-1] == "mine"  # the caller's own callbacks come last
    assert rows.data is data.train  # rows_trained counts what the training split hands out
    assert system.logger is logger and system.every_seconds == 10.0
    assert tensorboard.run_id == "run-1"
    assert preemption.checkpoint is ckpt  # SIGTERM saves through the same Checkpoint
    assert (ckpt.every_n_steps, ckpt.keep, ckpt.resume) == (7, 5, False)
    assert Path(ckpt.directory) == checkpoint_dir(exp) and ckpt.metadata == {
        "run_id": "run-1",
        "config": config_fingerprint(exp),
    }
    assert (stop.monitor, stop.patience, stop.stopping_threshold) == ("val_loss", 4, 0.2)
    assert (stop.divergence_threshold, stop.mode, stop.run_id) == (9.0, "min", "run-1")
    assert tp.batch_size == 32 and tp.log_every_n_steps == 3 == logger.log_every_n_steps
    assert logger.run_id == "run-1" and logger.end_run is False
    assert plots.confusion_data[1] == data.validation.steps
    # Other ranks get the same callbacks (each gates its own writes), but no progress bar and
    # no TensorBoard writer.
    others = make_callbacks(_run(exp, World(rank=1, size=2), None), data)
    assert [type(c) for c in others] == [
        Checkpoint,
        RowsTrained,
        EarlyStopping,
        Throughput,
        SystemMetrics,
        SaveAtEpochEnd,
        MLflowLogger,
        Plots,
        Preemption,
    ]


def test_prometheus_settings_add_its_callback_fed_by_the_run_s_own_figures(digits_table, tmp_path):
    from keras_dl.callbacks.prometheus import PrometheusMetrics
    from tests.conftest import seed_store

    uri = seed_store(tmp_path / "mlflow.db")
    recipe, exp = _exp(
        digits_table,
        tmp_path,
        f"tracking.uri={uri}",
        "tracking.prometheus_pushgateway=http://127.0.0.1:9091",
        "tracking.prometheus_final_scrape_seconds=5",
    )
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run("0").info.run_id
    for count in (1, 2):  # as the launcher logs each automatic restart
        client.log_metric(run_id, "keras_dl.restarts", count, step=count)
    data = make_splits(exp.data, 32, accept=recipe.accept, preprocess=recipe.preprocess)
    cbs = make_callbacks(_run(exp, World(), run_id), data)
    types = [type(c) for c in cbs]
    # After the epoch's checkpoint and the logger, before plots and the rest.
    assert types.index(PrometheusMetrics) == types.index(MLflowLogger) + 1
    assert types.index(SaveAtEpochEnd) == types.index(MLflowLogger) - 1
    prom = cbs.prometheus
    assert prom.metrics.restarts == 2 and prom.metrics.run_id == run_id
    assert prom.metrics.recipe == "digits"
    assert (prom.port, prom.bind, prom.final_scrape_seconds) == (None, "127.0.0.1", 5.0)
    assert prom.throughput is cbs.throughput and prom.preemption is cbs.after_logger[-1]
    assert cbs.system_metrics.also == prom.record_system
    # Other ranks send their figures to rank 0 and expose nothing themselves.
    others = make_callbacks(_run(exp, World(rank=1, size=2), None), data)
    assert others.prometheus.metrics is None
    # Off by default.
    recipe, plain = _exp(digits_table, tmp_path)
    assert make_callbacks(_run(plain, World(), "run-1"), data).prometheus is None


def test_bad_callback_settings_stop_before_any_work(digits_table, tmp_path):
    with pytest.raises(ConfigError, match="callbacks.mode='up' is not one of auto, min, max"):
        _exp(digits_table, tmp_path, "callbacks.mode=up")
    with pytest.raises(
        ConfigError, match="callbacks.keep_checkpoints=0 is outside the allowed range >= 1"
    ):
        _exp(digits_table, tmp_path, "callbacks.keep_checkpoints=0")
    with pytest.raises(ConfigError, match="Unknown config key 'callbacks.patiense'"):
        _exp(digits_table, tmp_path, "callbacks.patiense=3")


def test_the_recorded_run_is_resumed_only_with_a_checkpoint_to_resume(
    digits_table, tmp_path, mlflow_uri
):
    _, exp = _exp(digits_table, tmp_path, f"tracking.uri={mlflow_uri}")
    with mlflow.start_run() as run:
        pass
    record_run_id(exp, run.info.run_id)
    assert resume_run_id(exp) is None  # no checkpoint yet: a new run
    Checkpoints(checkpoint_dir(exp)).save(10, tiny_model(), {"epoch": 0})
    assert resume_run_id(exp) == run.info.run_id
    _, fresh = _exp(digits_table, tmp_path, f"tracking.uri={mlflow_uri}", "runtime.resume=false")
    assert resume_run_id(fresh) is None
    (Path(checkpoint_dir(exp)) / COMPLETE).write_text("{}")  # that training finished
    assert resume_run_id(exp) is None
    (Path(checkpoint_dir(exp)) / COMPLETE).unlink()
    record_run_id(exp, "0123456789abcdef0123456789abcdef")  # not in this store
    assert resume_run_id(exp) is None


def test_a_changed_config_is_not_resumed_but_more_epochs_are(digits_table, tmp_path, mlflow_uri):
    _, exp = _exp(digits_table, tmp_path, f"tracking.uri={mlflow_uri}")
    with mlflow.start_run() as run:
        pass
    record_run_id(exp, run.info.run_id)
    header = {"epoch": 1, "config": config_fingerprint(exp)}
    Checkpoints(checkpoint_dir(exp)).save(10, tiny_model(), header)
    _, longer = _exp(digits_table, tmp_path, f"tracking.uri={mlflow_uri}", "train.epochs=50")
    assert resume_run_id(longer) == run.info.run_id
    _, other = _exp(digits_table, tmp_path, f"tracking.uri={mlflow_uri}", "model.filters=8")
    assert config_fingerprint(other) != config_fingerprint(exp)
    assert resume_run_id(other) is None


@pytest.mark.slow  # 34 s on 2 cores
def test_an_epochs_checkpoint_holds_its_whole_logs_for_a_resume_to_backfill(digits_table, tmp_path):
    # On the two-host cluster (2026-12-02) a worker died between epoch 2's checkpoint and its
    # rows_trained: the header's logs, saved before rows_trained was added, lacked it, and the
    # resumed run's rows_trained had no epoch 2.
    from keras_dl.train import fit

    recipe, exp = _exp(
        digits_table,
        tmp_path,
        "train.epochs=1",
        "train.verbose=0",
        "callbacks.plots=false",
        "data.validation_split=",
    )
    fit(exp, recipe)
    header = read_header(list_checkpoints(checkpoint_dir(exp))[-1])
    logs = header["last_epoch"]["logs"]
    assert header["last_epoch"]["epoch"] == 0
    assert logs["rows_trained"] == 1257, logs  # the train split, every row once
    assert {"loss", "accuracy", "rows_trained", "samples_per_sec"} <= set(logs), sorted(logs)
