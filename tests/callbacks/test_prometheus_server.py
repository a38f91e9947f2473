"""A real Prometheus scrapes a 2-rank Horovod run; a real Pushgateway takes a run's pushes.

Debian's ``prometheus`` and ``prometheus-pushgateway`` (scripts/setup_prometheus.sh installs
them); each test skips with that message only when its binary is missing.
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.callbacks.helpers import _free_port, tiny_data, tiny_model
from tests.conftest import HEAVY
from tests.servers import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "keras_dl_rules.yml"
DASHBOARD = REPO / "monitoring" / "keras_dl_dashboard.json"
MISSING = "{} is not installed: run scripts/setup_prometheus.sh (Debian's {} package)."


def _need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(MISSING.format(binary, binary))
    return path


class Prometheus(LoopbackServer):
    """Prometheus scraping ``target`` every second, with keras_dl's rules, data in ``root``."""

    name = "Prometheus"

    def __init__(self, root: Path, target: str):
        super().__init__()
        self.root = root
        config = root / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n"
            f"  - job_name: keras_dl\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.config = config

    def command(self, port: int) -> list[str]:
        return [
            _need("prometheus"),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]


class Pushgateway(LoopbackServer):
    name = "the Pushgateway"

    def command(self, port: int) -> list[str]:
        return [_need("prometheus-pushgateway"), f"--web.listen-address=127.0.0.1:{port}"]


# Every series and the ranks it must have: rank 0 holds the run-wide ones.
BOTH = ("0", "1")
EXPECTED = {
    "keras_dl_step": BOTH,
    "keras_dl_epoch": BOTH,
    "keras_dl_samples_per_second": BOTH,
    "keras_dl_input_wait_fraction": BOTH,
    "keras_dl_step_time_seconds": BOTH,
    "keras_dl_last_step_timestamp_seconds": BOTH,
    "keras_dl_seconds_since_last_step": BOTH,
    "keras_dl_system_cpu_percent": BOTH,
    "keras_dl_system_rss_bytes": BOTH,
    "keras_dl_system_read_bytes": BOTH,
    "keras_dl_system_write_bytes": BOTH,
    'keras_dl_epoch_metric{metric="loss",': ("0",),
    "keras_dl_running": ("0",),
    "keras_dl_preemptions_total": ("0",),
    "keras_dl_restarts_total": ("0",),
}


@HEAVY
@pytest.mark.slow
def test_prometheus_scrapes_every_figure_of_both_ranks_and_runs_the_dashboard(
    digits_table, tmp_path
):
    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment

    _need("prometheus")
    port = _free_port()
    prometheus = Prometheus(tmp_path, f"127.0.0.1:{port}")
    prometheus.start_if_down()
    try:
        exp = digits_experiment(
            digits_table,
            tmp_path,
            "runtime.strategy=horovod",
            "runtime.np=-2",
            "train.epochs=2",
            "tracking.log_model=false",
            "tracking.registered_model=none",
            f"tracking.prometheus_port={port}",
            # The endpoint stays up (at most 15 s) until Prometheus has the final values.
            "tracking.prometheus_final_scrape_seconds=15",
        )
        result = launch(exp)
        run = result.run_id
        # The endpoint is gone, so instant queries now see stale series: ask at the last scrape.
        (series,) = prometheus.api("query", query=f'keras_dl_running{{run_id="{run}"}}[1h]')[
            "result"
        ]
        last = max(float(t) for t, _ in series["values"])
        assert len(series["values"]) >= 2  # scraped while training, and at the end
        assert [v for _, v in series["values"]][-1] == "0"  # the end state was scraped

        def query(expr: str) -> list[dict]:
            return prometheus.api("query", query=expr, time=last)["result"]

        for name, ranks in EXPECTED.items():
            selector = name if "{" in name else name + "{"
            got = query(f'{selector}run_id="{run}"}}')
            assert sorted(r["metric"]["rank"] for r in got) == list(ranks), name
            assert {r["metric"]["recipe"] for r in got} == {"digits"}, name
        # The final values: both ranks ran 2 epochs of the same steps.
        steps = {r["metric"]["rank"]: float(r["value"][1]) for r in query("keras_dl_step")}
        assert steps["0"] == steps["1"] > 0
        assert {float(r["value"][1]) for r in query("keras_dl_epoch")} == {2.0}

        # Every panel of the dashboard has data (but GPU use: this machine has no GPU).
        panels = json.loads(DASHBOARD.read_text())["panels"]
        for panel in panels:
            for target in panel["targets"]:
                expr = target["expr"].replace("$run_id", run)
                if "gpu" in expr:
                    continue
                assert query(expr), panel["title"]

        # The alert rules loaded, both of them, and evaluate without error.
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        assert {r["name"] for r in rules} == {"KerasDLThroughputHalved", "KerasDLNoStep"}
        assert {r["health"] for r in rules} <= {"ok", "unknown"}
    finally:
        prometheus.stop()


@pytest.mark.slow
@HEAVY
def test_a_horovod_jobs_port_is_served_by_the_launcher_with_every_ranks_figures(
    digits_table, tmp_path
):
    """The launcher's process (this one) serves tracking.prometheus_port while the ranks train,
    with rank 1's figures too (rank 0 feeds it): a scraper's target does not move with rank 0."""
    import os
    import threading

    import psutil
    from prometheus_client.parser import text_string_to_metric_families

    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment

    port = _free_port()
    exp = digits_experiment(
        digits_table,
        tmp_path,
        "runtime.strategy=horovod",
        "runtime.np=-2",
        "train.epochs=3",
        "tracking.log_model=false",
        "tracking.registered_model=none",
        f"tracking.prometheus_port={port}",
    )
    scrapes: list[dict] = []
    owners: set[int] = set()
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(0.5):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            owners.update(
                os.getpid()
                for c in psutil.Process().net_connections(kind="tcp")
                if c.laddr.port == port and c.status == psutil.CONN_LISTEN
            )
            scrapes.append(
                {
                    (s.name, s.labels.get("rank")): s.value
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                }
            )

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        launch(exp)
    finally:
        stop.set()
        scraper.join(30)
    assert owners == {os.getpid()}  # the port listened in the launcher's own process
    running = [s for s in scrapes if s.get(("keras_dl_running", "0")) == 1.0]
    assert running, f"no scrape while the ranks trained ({len(scrapes)} scrapes)"
    assert any(s.get(("keras_dl_step", "1"), 0) > 0 for s in running), running[-1]
    assert any(s.get(("keras_dl_epoch", "1"), 0) >= 1 for s in running)


def test_a_fit_pushes_one_group_per_rank_to_a_real_pushgateway_and_leaves_it(tmp_path):
    from keras_dl.callbacks import Throughput
    from keras_dl.callbacks.prometheus import PrometheusMetrics

    _need("prometheus-pushgateway")
    gateway = Pushgateway()
    gateway.start_if_down()
    try:
        url = f"http://127.0.0.1:{gateway.port}"
        x, y = tiny_data(rows=64)
        throughput = Throughput(batch_size=16)
        prom = PrometheusMetrics("run-p", "tiny", pushgateway=url, throughput=throughput)
        # What rank 1's sample looks like once the epoch-end allgather brought it to rank 0.
        prom.record_system(1, {"cpu_percent": 42.0})
        tiny_model().fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[throughput, prom])
        with urllib.request.urlopen(f"{url}/api/v1/metrics", timeout=30) as r:
            groups = json.load(r)["data"]
        by_rank = {g["labels"]["rank"]: g for g in groups if g["labels"].get("run_id") == "run-p"}
        assert sorted(by_rank) == ["0", "1"]
        zero = by_rank["0"]
        assert zero["labels"]["job"] == "keras_dl"
        # Each group names its rank's host: rank 0's is this one; rank 1's came without the
        # allgather of a Horovod job's start, so it is not known here.
        assert zero["labels"]["host"] == socket.gethostname()
        assert by_rank["1"]["labels"]["host"] == "unknown"

        def value(group, name, **labels):
            (m,) = [
                m
                for m in group[name]["metrics"]
                if all(m["labels"].get(k) == v for k, v in labels.items())
            ]
            return float(m["value"])

        assert value(zero, "keras_dl_step") == 8
        assert value(zero, "keras_dl_epoch") == 2
        assert value(zero, "keras_dl_running") == 0  # the push at the end of fit
        assert value(zero, "keras_dl_epoch_metric", metric="loss") > 0
        assert value(zero, "keras_dl_samples_per_second") > 0
        assert value(by_rank["1"], "keras_dl_system_cpu_percent") == 42.0
        assert "keras_dl_step" not in by_rank["1"]  # each group holds its own rank's series
    finally:
        gateway.stop()


@HEAVY
@pytest.mark.slow
def test_two_multiworker_workers_push_a_group_each_labelled_with_its_host(digits_table, tmp_path):
    """The hosts were gathered with Horovod's allgather_object: under the multi-worker strategy
    (Horovod not initialized) every worker failed at the start of fit."""
    from keras_dl.launch import launch
    from tests.distribute.conftest import digits_experiment

    _need("prometheus-pushgateway")
    gateway = Pushgateway()
    gateway.start_if_down()
    try:
        url = f"http://127.0.0.1:{gateway.port}"
        exp = digits_experiment(
            digits_table,
            tmp_path,
            "runtime.strategy=multiworker",
            "runtime.np=-2",
            "train.epochs=1",
            "train.batch_size=128",
            "tracking.log_model=false",
            "tracking.registered_model=none",
            f"tracking.prometheus_pushgateway={url}",
        )
        run = launch(exp).run_id
        with urllib.request.urlopen(f"{url}/api/v1/metrics", timeout=30) as r:
            groups = json.load(r)["data"]
        hosts = {
            g["labels"]["rank"]: g["labels"]["host"]
            for g in groups
            if g["labels"].get("run_id") == run
        }
        assert hosts == {"0": socket.gethostname(), "1": socket.gethostname()}
    finally:
        gateway.stop()


def test_an_unreachable_pushgateway_warns_once_and_training_goes_on():
    from keras_dl.callbacks.prometheus import PrometheusMetrics

    x, y = tiny_data(rows=32)
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    prom = PrometheusMetrics("run-u", "tiny", pushgateway=url)
    with pytest.warns(UserWarning, match=r"prometheus_pushgateway=.*failed.*goes on") as caught:
        history = tiny_model().fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[prom])
    assert len(history.history["loss"]) == 2
    # Three pushes failed (two epoch ends and the end): one warning.
    assert len([w for w in caught if "prometheus_pushgateway" in str(w.message)]) == 1
