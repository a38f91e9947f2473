"""System metrics of two real Horovod ranks (np=-2) in the one MLflow run rank 0 writes."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from keras_dl.launch import launch
from tests.conftest import HEAVY, runs_in
from tests.distribute.workers import train_and_report
from tests.report.test_report import series_in

pytestmark = HEAVY  # see tests/conftest.py

BASE = ("cpu_percent", "rss_bytes", "read_bytes", "write_bytes")


@pytest.mark.slow
def test_each_rank_has_its_system_metrics_in_the_one_run(digits_exp, tmp_path):
    exp = digits_exp(
        "runtime.strategy=horovod",
        "runtime.np=-2",
        "train.epochs=3",
        "tracking.log_model=false",
        "tracking.system_metrics_seconds=0.1",
    )
    report = launch(exp, main=train_and_report)
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.run_id == report["result"].run_id and run.info.status == "FINISHED"
    client = mlflow.MlflowClient(exp.tracking.uri)
    histories = {}
    for rank in (0, 1):
        for name in BASE:
            key = f"system/rank_{rank}/{name}"
            history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            # Every sample a rank took arrived (rank 1's through the epoch-end allgather).
            assert history and [m.step for m in history] == list(range(len(history))), key
            histories[key] = history
    assert not [k for k in run.data.metrics if k.startswith("system/rank_2/")]
    # Two processes: each rank's samples are its own (different times and resident sizes).
    rss0 = [(m.timestamp, m.value) for m in histories["system/rank_0/rss_bytes"]]
    rss1 = [(m.timestamp, m.value) for m in histories["system/rank_1/rss_bytes"]]
    assert rss0 != rss1
    start, end = run.info.start_time, run.info.end_time
    assert all(start <= m.timestamp <= end for m in histories["system/rank_1/cpu_percent"])
    # The run's report.html, built by rank 0 from the run: one line per rank on each chart.
    page = client.download_artifacts(run.info.run_id, "report.html", str(tmp_path))
    drawn = {(chart, name) for section, chart, name, *_ in series_in(Path(page).read_text())}
    assert {(n, f"rank_{r}") for n in BASE for r in (0, 1)} <= drawn, drawn
