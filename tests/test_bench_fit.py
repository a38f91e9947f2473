"""`keras-dl bench fit --quick`: one fit fed by keras_dl beside the same fit from memory."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_quick_fit_bench_reports_both_feeds_and_their_ratio(tmp_path):
    out = tmp_path / "fit.json"
    done = run_cli("bench", "fit", "--quick", "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout[done.stdout.index("{") :]) == report
    for setup in ("mlp_wide", "cnn_images"):
        r = report[setup]
        assert r["steps"] >= 1 and r["batch"] > 0
        assert set(r["samples_per_s"]) == {"keras_dl", "keras_dl_stream", "in_memory"}
        assert all(v > 0 for v in r["samples_per_s"].values())
        assert all(0 <= v <= 1 for v in r["input_wait_fraction"].values())
        assert (
            set(r["ratios"])
            == set(r["ratio_spread"])
            == {"keras_dl/in_memory", "keras_dl/keras_dl_stream"}
        )
    assert [t["setup"] for t in report["targets"]] == ["mlp_wide", "cnn_images"]
    assert all(t["target"] == 0.95 and isinstance(t["met"], bool) for t in report["targets"])
