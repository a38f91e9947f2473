"""SystemMetrics: each rank's CPU, memory, I/O (and GPU) in the run, on a real SQLite store."""

from __future__ import annotations

import threading
import time

import keras
import mlflow
import pytest

from keras_dl.callbacks import MLflowLogger, SystemMetrics
from keras_dl.callbacks.system_sampler import SystemSampler
from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from tests.callbacks.helpers import tiny_data, tiny_model
from tests.conftest import runs_in

BASE = ("cpu_percent", "rss_bytes", "read_bytes", "write_bytes")


class _SlowSteps(keras.callbacks.Callback):
    """Makes a tiny fit last long enough for several samples."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "SystemSampler"]


def test_rank_0_samples_reach_the_run_with_their_times_and_the_thread_ends_with_fit(mlflow_uri):
    x, y = tiny_data(rows=256)
    model = tiny_model()
    logger = MLflowLogger(experiment="tiny")
    system = SystemMetrics(logger, every_seconds=0.1)
    start = int(time.time() * 1000)
    model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[_SlowSteps(), system, logger])
    end = int(time.time() * 1000)
    assert _sampler_threads() == []  # no thread outlives fit
    (run,) = runs_in(mlflow_uri)
    client = mlflow.MlflowClient(mlflow_uri)
    for name in BASE:
        history = sorted(
            client.get_metric_history(run.info.run_id, f"system/rank_0/{name}"),
            key=lambda m: m.step,
        )
        # 64 steps x 20 ms >= 1.2 s at one sample per 0.1 s
        assert len(history) >= 3, (name, len(history), logger.unsent, logger.dropped, run.data)
        assert [m.step for m in history] == list(range(len(history))), name
        assert all(start <= m.timestamp <= end for m in history), name
    rss = client.get_metric_history(run.info.run_id, "system/rank_0/rss_bytes")
    assert min(m.value for m in rss) > 10_000_000  # a TensorFlow process holds > 10 MB
    cpu = client.get_metric_history(run.info.run_id, "system/rank_0/cpu_percent")
    assert max(m.value for m in cpu) > 0  # it trained between samples
    # No nvidia-ml-py here (or no GPU): no GPU figures, rather than zeros.
    assert not [k for k in run.data.metrics if k.startswith("system/rank_0/gpu_")]
    assert logger.unsent == 0


def test_a_fit_shorter_than_the_interval_has_a_first_and_a_last_sample(mlflow_uri):
    """Issue 35's seam: a run shorter than the interval logged no system metrics at all."""
    x, y = tiny_data()
    logger = MLflowLogger(experiment="tiny")
    system = SystemMetrics(logger, every_seconds=3600)
    start = int(time.time() * 1000)
    tiny_model().fit(x, y, epochs=2, verbose=0, callbacks=[system, logger])
    end = int(time.time() * 1000)
    assert _sampler_threads() == []
    (run,) = runs_in(mlflow_uri)
    client = mlflow.MlflowClient(mlflow_uri)
    for name in BASE:
        history = client.get_metric_history(run.info.run_id, f"system/rank_0/{name}")
        assert sorted(m.step for m in history) == [0, 1], name  # when fit began, and ended
        assert all(start <= m.timestamp <= end for m in history), name
    cpu = client.get_metric_history(run.info.run_id, "system/rank_0/cpu_percent")
    assert all(m.value > 0 for m in cpu)  # the first: since the process started (TF's import)
    assert logger.unsent == 0


def test_zero_seconds_is_off(mlflow_uri):
    x, y = tiny_data()
    logger = MLflowLogger(experiment="tiny")
    system = SystemMetrics(logger, every_seconds=0)
    tiny_model().fit(x, y, epochs=1, verbose=0, callbacks=[_SlowSteps(), system, logger])
    (run,) = runs_in(mlflow_uri)
    assert not [k for k in run.data.metrics if k.startswith("system/")]
    assert _sampler_threads() == []


def test_a_fit_that_raises_leaves_no_thread_once_closed(mlflow_uri):
    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                raise RuntimeError("boom")

    x, y = tiny_data()
    logger = MLflowLogger(experiment="tiny")
    system = SystemMetrics(logger, every_seconds=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        tiny_model().fit(
            x, y, epochs=1, batch_size=8, verbose=0, callbacks=[system, logger, Boom()]
        )
    assert len(_sampler_threads()) == 1  # Keras skipped on_train_end
    system.close()
    logger.flush()
    assert _sampler_threads() == []


def test_without_nvidia_ml_py_the_sampler_says_so_and_reports_no_gpu():
    pytest.importorskip("psutil")
    try:
        import pynvml  # noqa: F401

        pytest.skip("nvidia-ml-py is installed here: see the NVML test below")
    except ImportError:
        pass
    sampler = SystemSampler(60)
    sampler.start()
    try:
        assert "nvidia-ml-py is not installed" in sampler.gpu_status
        assert set(sampler.sample()) == set(BASE)
    finally:
        sampler.stop()
    assert _sampler_threads() == []


def test_with_nvidia_ml_py_the_sampler_reports_what_nvml_found():
    """Runs where nvidia-ml-py is installed: on a host without an NVIDIA driver NVML does not
    start (no GPU figures, and the reason); with GPUs, each one's utilisation and memory."""
    pytest.importorskip("pynvml")
    sampler = SystemSampler(60)
    sampler.start()
    try:
        values = sampler.sample()
        if sampler.gpu_status.startswith("GPU figures"):
            assert any(k.endswith("_utilization_percent") for k in values)
            assert any(k.endswith("_memory_used_bytes") for k in values)
        else:
            assert "NVML" in sampler.gpu_status, sampler.gpu_status
            assert set(values) == set(BASE)
    finally:
        sampler.stop()


@pytest.mark.parametrize("seconds", ["-1", "0.01"])
def test_a_bad_interval_is_a_named_error(seconds):
    with pytest.raises(ConfigError, match=r"tracking\.system_metrics_seconds.*0 \(off\)"):
        resolve(
            load_recipe("digits").defaults,
            sets=["data.table=t", f"tracking.system_metrics_seconds={seconds}"],
        )


def _digits_exp(digits_table, tmp_path):
    return resolve(
        load_recipe("digits").defaults,
        sets=[
            f"data.table={digits_table}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "train.epochs=2",
            "train.verbose=0",
            "tracking.log_model=false",
            "tracking.system_metrics_seconds=0.1",
        ],
    )


@pytest.mark.slow
def test_the_default_callbacks_log_system_metrics_into_the_training_run(digits_table, tmp_path):
    from keras_dl.train import fit

    exp = _digits_exp(digits_table, tmp_path)
    result = fit(exp)
    assert _sampler_threads() == []
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.run_id == result.run_id
    assert {f"system/rank_0/{name}" for name in BASE} <= set(run.data.metrics)


def test_keras_dl_fit_that_raises_stops_the_sampler(digits_table, tmp_path):
    from keras_dl.train import fit

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit(_digits_exp(digits_table, tmp_path), callbacks=[Boom()])
    assert _sampler_threads() == []
