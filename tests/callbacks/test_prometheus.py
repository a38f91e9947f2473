"""PrometheusMetrics: the exposition of a real fit's figures, read over its HTTP endpoint."""

from __future__ import annotations

import re
import urllib.request

import keras
import pytest

from keras_dl.callbacks import SystemMetrics, Throughput
from keras_dl.callbacks.mlflow_logger import MLflowLogger
from keras_dl.callbacks.prometheus import PrometheusMetrics
from keras_dl.callbacks.prometheus_export import RunMetrics
from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from tests.callbacks.helpers import tiny_data, tiny_model

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


def parse(text: str) -> list[tuple[str, dict, float]]:
    """The samples of an exposition: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            out.append((m[1], labels, float(m[3])))
    return out


class _Scrape(keras.callbacks.Callback):
    """Reads the endpoint at the end of epoch 1, as a Prometheus would mid-run."""

    def __init__(self, prom: PrometheusMetrics):
        super().__init__()
        self.prom, self.text = prom, None

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            url = f"http://127.0.0.1:{self.prom.served_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                self.text = r.read().decode()


def test_a_fit_serves_every_figure_labelled_on_loopback_and_prints_the_chosen_port(
    mlflow_uri, capsys
):
    x, y = tiny_data(rows=64)
    model = tiny_model()
    throughput = Throughput(batch_size=16)
    logger = MLflowLogger(experiment="tiny")
    prom = PrometheusMetrics("run-1", "tiny", port=0, throughput=throughput, restarts=2)
    system = SystemMetrics(logger, every_seconds=3600, also=prom.record_system)
    scrape = _Scrape(prom)
    model.fit(
        x,
        y,
        validation_data=(x, y),
        epochs=2,
        batch_size=16,
        verbose=0,
        callbacks=[throughput, system, logger, prom, scrape],
    )
    printed = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", capsys.readouterr().out)
    assert printed and int(printed[1]) > 0  # port 0: the kernel's choice, printed
    samples = parse(scrape.text)
    assert {s[1]["run_id"] for s in samples} == {"run-1"}
    assert {s[1]["recipe"] for s in samples} == {"tiny"}
    assert {s[1]["rank"] for s in samples} == {"0"}
    values = {(n, lab.get("metric")): v for n, lab, v in samples}
    assert values[("keras_dl_step", None)] == 8  # 4 steps a epoch, 2 epochs
    assert values[("keras_dl_epoch", None)] == 2
    assert values[("keras_dl_samples_per_second", None)] > 0
    # Not instrumented here (arrays, not a tf.data pipeline): no input wait, rather than 0.
    assert ("keras_dl_input_wait_fraction", None) not in values
    assert values[("keras_dl_step_time_seconds", None)] > 0
    assert values[("keras_dl_epoch_metric", "loss")] > 0
    assert ("keras_dl_epoch_metric", "val_accuracy") in values
    assert ("keras_dl_epoch_metric", "samples_per_sec") not in values  # its own series
    assert values[("keras_dl_seconds_since_last_step", None)] >= 0
    assert values[("keras_dl_last_step_timestamp_seconds", None)] > 1e9
    assert values[("keras_dl_system_rss_bytes", None)] > 10_000_000
    assert values[("keras_dl_running", None)] == 1
    assert values[("keras_dl_restarts_total", None)] == 2
    assert values[("keras_dl_preemptions_total", None)] == 0
    # fit ended: the endpoint is closed.
    assert prom.served_port is None and prom.metrics.running == 0


def test_the_input_wait_is_exported_when_the_data_is_instrumented():
    import tensorflow as tf

    x, y = tiny_data(rows=64)
    throughput = Throughput(batch_size=16, wait_every_n_steps=1)
    ds = throughput.instrument(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
    prom = PrometheusMetrics("run-2", "tiny", throughput=throughput)
    tiny_model().fit(ds, epochs=1, verbose=0, callbacks=[throughput, prom])
    (wait,) = [s for s in prom.metrics.collect() if s.name == "keras_dl_input_wait_fraction"]
    assert 0 <= wait.samples[0].value <= 1


def test_the_server_binds_loopback_unless_widened():
    metrics = RunMetrics("run-3", "tiny")
    port = metrics.serve(0)
    try:
        assert metrics._server.server_address == ("127.0.0.1", port)
    finally:
        metrics.stop_serving()
    wide = RunMetrics("run-4", "tiny")
    wide.serve(0, bind="0.0.0.0")
    try:
        assert wide._server.server_address[0] == "0.0.0.0"
    finally:
        wide.stop_serving()


def test_runs_in_one_process_keep_their_own_registries():
    a, b = RunMetrics("a", "tiny"), RunMetrics("b", "tiny")
    a.set_progress(0, step=3)
    b.set_progress(0, step=5)
    from prometheus_client import generate_latest

    for metrics, step in ((a, 3), (b, 5)):
        samples = parse(generate_latest(metrics.registry).decode())
        assert [(lab["run_id"], v) for n, lab, v in samples if n == "keras_dl_step"] == [
            (metrics.run_id, step)
        ]


def test_gpu_samples_get_a_gpu_label():
    m = RunMetrics("r", "tiny")
    m.set_system(1, {"gpu_0_utilization_percent": 50.0, "cpu_percent": 12.0})
    names = {(f.name, tuple(s.labels.get("gpu", "") for s in f.samples)) for f in m.collect()}
    assert ("keras_dl_system_gpu_utilization_percent", ("0",)) in names
    assert ("keras_dl_system_cpu_percent", ("",)) in names


@pytest.mark.parametrize(
    "item, match",
    [
        ("tracking.prometheus_port=70000", r"tracking.prometheus_port=70000 is not a TCP port"),
        ("tracking.prometheus_port=-1", r"tracking.prometheus_port=-1 is not a TCP port"),
        ("tracking.prometheus_bind=localhost", r"tracking.prometheus_bind='localhost' is not an"),
        ("tracking.prometheus_pushgateway=gw:9091", r"tracking.prometheus_pushgateway='gw:9091'"),
        ("tracking.prometheus_final_scrape_seconds=-1", r"prometheus_final_scrape_seconds=-1"),
        ("tracking.prometheus_prot=9464", r"'tracking.prometheus_prot'.*prometheus_port"),
    ],
)
def test_bad_prometheus_settings_name_their_key(item, match):
    with pytest.raises(ConfigError, match=match):
        resolve(load_recipe("digits").defaults, sets=["data.table=/tmp/t", item])


class _Sigterm(keras.callbacks.Callback):
    """SIGTERM to this process at the end of step 2, as a preempted node's rank gets it."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)


def test_a_preempted_fit_ends_with_the_preemption_counted_and_running_0(capsys):
    from keras_dl.callbacks.preemption import Preemption
    from keras_dl.errors import Preempted

    x, y = tiny_data(rows=64)
    preemption = Preemption()
    prom = PrometheusMetrics("run-5", "tiny", preemption=preemption)
    with pytest.raises(Preempted):
        tiny_model().fit(
            x, y, epochs=2, batch_size=16, verbose=0, callbacks=[_Sigterm(), prom, preemption]
        )
    assert prom.metrics.running == 1  # Keras skipped on_train_end
    prom.close()  # what RunCallbacks.after_failure does
    values = {f.name: f.samples[0].value for f in prom.metrics.collect() if f.samples}
    assert values["keras_dl_preemptions"] == 1 and values["keras_dl_running"] == 0
    assert values["keras_dl_step"] == 2
