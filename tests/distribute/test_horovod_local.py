"""Horovod with np=-2 on this host: real Gloo processes training the digits recipe."""

from __future__ import annotations

import threading
from pathlib import Path

import keras
import mlflow
import pytest

from keras_dl.errors import DistributedError
from keras_dl.launch import HorovodRunner, launch
from keras_dl.train import fit
from tests.conftest import HEAVY
from tests.distribute.checks import check_horovod_run
from tests.distribute.workers import train_and_report

pytestmark = HEAVY  # see tests/conftest.py


@pytest.mark.slow
def test_two_local_ranks_train_like_one_process(digits_exp, tmp_path):
    exp = digits_exp("runtime.strategy=horovod", "runtime.np=-2")
    report = launch(exp, main=train_and_report)
    check_horovod_run(report, exp)
    # The registered model reloads with the plain optimizer class, without keras_dl's wrapper.
    version = report["result"].registered_version
    mlflow.set_tracking_uri(exp.tracking.uri)
    loaded = mlflow.keras.load_model(f"models:/{exp.tracking.registered_model}/{version}")
    assert type(loaded.optimizer) is keras.optimizers.Adam

    # The same global batch in one process reaches about the same accuracy.
    single = fit(
        digits_exp(
            "runtime.strategy=none",
            f"tracking.uri=sqlite:///{tmp_path / 'single.db'}",
            "tracking.log_model=false",
        )
    )
    horovod_acc = report["result"].metrics["test_accuracy"]
    assert horovod_acc > 0.85
    assert abs(horovod_acc - single.metrics["test_accuracy"]) < 0.05


@pytest.mark.slow
def test_mixed_precision_fp16_allreduce_and_linear_scaling_keep_ranks_identical(digits_exp):
    exp = digits_exp(
        "runtime.strategy=horovod",
        "runtime.np=-2",
        "train.epochs=2",
        "train.mixed_precision=true",
        "runtime.fp16_allreduce=true",
        "runtime.lr_scaling=linear",
        "runtime.warmup_epochs=1",
        "tracking.log_model=false",
    )
    report = launch(exp, main=train_and_report)
    ranks = report["ranks"]
    # The loss-scale optimizer checks the *averaged* gradients, so ranks skip the same steps.
    assert ranks[0]["policy"] == "mixed_float16"
    assert "LossScaleOptimizer" in ranks[0]["optimizer_classes"]
    assert ranks[0]["digest"] == ranks[1]["digest"]
    losses = [e["logs"]["loss"] for e in ranks[0]["epochs"]]
    assert losses[-1] < losses[0]


def test_runner_returns_rank_zero_result():
    def main(offset):
        import horovod.tensorflow as hvd

        hvd.init()
        return hvd.rank() + offset, hvd.size()

    assert HorovodRunner(np=-2).run(main, offset=10) == (10, 2)


def test_the_ranks_get_the_drivers_horovod_settings_not_horovods_none(monkeypatch):
    """Horovod 0.28.1's local launcher sets HOROVOD_CYCLE_TIME and HOROVOD_CACHE_CAPACITY to
    "(None,)" (read as 0: a waiting rank spins a core); each rank gets the driver's values back,
    or none (Horovod's defaults) where the driver had none."""
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)

    def settings():
        import os

        return {k: os.environ.get(k) for k in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")}

    got = HorovodRunner(np=-2).run(settings)
    assert got == {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_CACHE_CAPACITY": None}


def test_unpicklable_function_is_a_clear_error():
    lock = threading.Lock()

    def main():
        with lock:
            return 1

    with pytest.raises(DistributedError, match=r"main.*cannot be pickled.*inside its body"):
        HorovodRunner(np=-2).run(main)


def test_np_zero_is_a_clear_error():
    with pytest.raises(DistributedError, match=r"np=0\) runs nothing: use np=-N .* or np=N"):
        HorovodRunner(np=0)


def test_one_local_rank_gets_an_output_folder_named_like_horovods():
    """np=-1 runs (end to end: tests/distribute/test_resume_other_ranks.py's last attempt):
    Horovod 0.28.1's own rank padding fails for one rank; keras_dl's names the rest alike."""
    import horovod.runner.gloo_run as gloo_run

    from keras_dl.launch.runner import _one_rank_padding, _pad_rank

    with pytest.raises(ValueError, match="math domain error"):
        gloo_run._pad_rank(0, 1)
    assert _pad_rank(0, 1) == "0"
    for size in (2, 3, 10, 11, 12, 100, 101, 1001):
        assert [_pad_rank(r, size) for r in range(size)] == [
            gloo_run._pad_rank(r, size) for r in range(size)
        ]
    original = gloo_run._pad_rank
    with _one_rank_padding():
        assert gloo_run._pad_rank(0, 1) == "0"
    assert gloo_run._pad_rank is original


@pytest.mark.slow
def test_two_ranks_train_every_row_of_a_one_row_group_table_once_per_epoch(digits_exp, tmp_path):
    """A table written in one row group (pandas' and deltalake's default shape for a small
    table) trains on 2 ranks: each epoch, every row once, on exactly one rank."""
    from keras_dl.data import read_table
    from tests.conftest import write_test_table
    from tests.distribute.workers import train_counting_rows

    exp = digits_exp("runtime.strategy=horovod", "runtime.np=-2", "train.epochs=2")
    rows = read_table(exp.data.table)
    one = write_test_table(str(tmp_path / "one"), rows, rows_per_group=rows.num_rows)
    exp = digits_exp(
        f"data.table={one}",
        "data.split_column=split",
        "runtime.strategy=horovod",
        "runtime.np=-2",
        "train.epochs=2",
        "train.batch_size=128",  # 1257 train rows: 629 and 628 per rank, 10 steps of 64
        "tracking.log_model=false",
    )
    ranks = launch(exp, main=train_counting_rows)
    train_rows = 1257
    for epoch in range(2):
        seen = [r["rows"][epoch] for r in ranks]
        assert sum(seen) == train_rows and max(seen) - min(seen) <= 1, seen
        # The logged value is the ranks' mean (MetricAverage): the padding counts nowhere.
        assert ranks[0]["logged"][epoch] == pytest.approx(train_rows / 2)


@pytest.mark.slow  # 36 s on 2 cores
def test_the_launcher_logs_the_batch_size_the_tabular_recipe_chose(tmp_path):
    """The driver fills in the tabular recipe's batch size before it logs the config, so the
    run's params and config.yaml hold what both ranks trained with."""
    import numpy as np
    import pyarrow as pa
    import yaml

    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from tests.conftest import write_test_table

    rng = np.random.default_rng(0)
    rows = 300
    split = np.where(np.arange(rows) % 5 == 0, "validation", "train")
    table = pa.table(
        {"x": rng.normal(size=rows), "label": rng.integers(0, 2, rows), "split": split}
    )
    path = write_test_table(str(tmp_path / "t"), table, rows_per_group=32)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = resolve(
        load_recipe("tabular").defaults,
        sets=[
            f"data.table={path}",
            "data.split_column=split",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "tracking.registered_model=none",
            "train.epochs=1",
            "train.verbose=0",
            "runtime.strategy=horovod",
            "runtime.np=-2",
        ],
    )
    assert exp.train.batch_size is None
    result = launch(exp)
    run = mlflow.MlflowClient(uri).get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.batch_size"] == "16"  # 240 training rows / 16, over 2 ranks
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["batch_size"] == 16 and saved["train"]["epochs"] == 1
    # The run the launcher created holds the config artifact too (as a run fit starts does).
    local = mlflow.MlflowClient(uri).download_artifacts(result.run_id, "config.yaml", tmp_path)
    assert yaml.safe_load(Path(local).read_text()) == saved


@pytest.mark.slow
def test_init_from_reaches_every_rank_through_rank_0s_broadcast(digits_exp, tmp_path):
    from keras_dl.model.registry import load_keras_model
    from tests.distribute.workers import digest

    champion = fit(digits_exp("runtime.strategy=none", "train.epochs=1"))
    assert champion.registered_version == 1
    exp = digits_exp(
        "runtime.strategy=horovod",
        "runtime.np=-2",
        "train.epochs=1",
        "model.init_from=models:/digits/1",
        f"runtime.run_dir={tmp_path / 'fine_tune'}",
        "tracking.log_model=false",
    )
    report = launch(exp, main=train_and_report)
    mlflow.set_tracking_uri(exp.tracking.uri)
    registered = digest(load_keras_model("models:/digits/1").get_weights())
    # Rank 0 loaded the registered weights; rank 1 got them from BroadcastState before step 1.
    assert [r["start_digest"] for r in report["ranks"]] == [registered, registered]
    tags = mlflow.MlflowClient().get_run(report["result"].run_id).data.tags
    assert tags["keras_dl.init_from"] == "models:/digits/1"
