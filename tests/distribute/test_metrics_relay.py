"""The launcher's Prometheus endpoint (keras_dl.launch.metrics_relay) takes rank 0's figures as
JSON over HTTP and serves them; anything else is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from keras_dl.callbacks.prometheus_export import RunMetrics
from keras_dl.callbacks.prometheus_feed import FEED_ENV, FeedSender
from keras_dl.launch.metrics_relay import MetricsRelay


def test_the_relay_serves_what_rank_0_sends_and_refuses_what_is_not_a_snapshot():
    relay = MetricsRelay("run-r", "tiny", 0, "127.0.0.1", "127.0.0.1")
    env = relay.start()
    try:
        url = env[FEED_ENV]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/feed")
        rank0 = RunMetrics("run-r", "tiny")  # rank 0's own, as its PrometheusMetrics holds it
        rank0.set_progress(0, step=7, epoch=2)
        rank0.set_progress(1, step=7, epoch=2)
        rank0.hosts[1] = "host-b"
        assert FeedSender(url, rank0.snapshot).send()
        with urllib.request.urlopen(
            f"http://127.0.0.1:{relay.served_port}/metrics", timeout=10
        ) as r:
            text = r.read().decode()
        samples = {
            (x.name, x.labels["rank"]): x.value
            for family in text_string_to_metric_families(text)
            for x in family.samples
            if x.labels.get("run_id") == "run-r"
        }
        assert samples[("keras_dl_step", "1")] == samples[("keras_dl_step", "0")] == 7.0
        assert samples[("keras_dl_epoch", "1")] == 2.0
        assert relay.metrics.hosts[1] == "host-b"
        for body in (b"not json", json.dumps([1, 2]).encode(), b"\x80\x81"):
            request = urllib.request.Request(url, data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError, match="400"):
                urllib.request.urlopen(request, timeout=10)
    finally:
        relay.close()
