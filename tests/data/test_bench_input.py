"""`keras-dl bench input --quick`: every path measured on generated tables, JSON out."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_quick_bench_reports_every_path_beside_its_baseline(tmp_path):
    out = tmp_path / "bench.json"
    done = run_cli("bench", "input", "--quick", "--out", str(out), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout[done.stdout.index("{") :]) == report
    for table, paths in (
        ("narrow", {"raw_pyarrow", "reader_alone", "in_memory", "stock", "keras_dl"}),
        ("wide", {"raw_pyarrow", "reader_alone", "in_memory", "stock", "keras_dl"}),
        ("images", {"petastorm_codec", "in_memory_decode", "keras_dl"}),
    ):
        assert set(report[table]["batches"]) == {"32", "256"}
        for figures in report[table]["batches"].values():
            assert set(figures["rows_per_s"]) == paths
            assert all(v > 0 for v in figures["rows_per_s"].values())
            assert all(v > 0 for v in figures["mb_per_s"].values())
            assert {f"keras_dl/{p}" for p in paths - {"keras_dl"}} <= set(figures["ratios"])
    assert set(report["wide"]["profile"]["32"]) == {
        "reader",
        "+convert",
        "+shuffle",
        "+from_generator",
        "+rebatch",
    }
    rss = report["rss"]
    assert rss["rows_8x"] == 8 * rss["rows_1x"] and rss["peak_rss_mb_1x"] > 100
    names = {(t["table"], t["ratio"]) for t in report["targets"]}
    assert ("wide", "keras_dl/stock") in names and ("narrow", "rss_8x/rss_1x - 1") in names
    assert all(isinstance(t["met"], bool) for t in report["targets"])
