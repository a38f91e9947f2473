"""``keras-dl bench distributed`` end to end, tiny: every figure present beside its baseline."""

from __future__ import annotations

import json

import pytest

from tests.conftest import HEAVY, run_cli

pytestmark = HEAVY  # see tests/conftest.py


@pytest.mark.slow
def test_bench_prints_each_figure_with_its_baseline(tmp_path):
    proc = run_cli(
        "bench",
        "distributed",
        "--width",
        "32",
        "--batch",
        "16",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--repeats",
        "1",  # each repeat costs 4 fresh TensorFlow processes
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The report is the last thing printed: a JSON object starting on its own line.
    out = "\n" + proc.stdout
    report = json.loads(out[out.rindex("\n{\n") + 1 :])
    grad_bytes = 4 * (64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10)
    assert report["setup"]["gradient_bytes"] == grad_bytes
    single = report["single"]
    assert single["replicas"] == 1 and single["step_ms"] > 0
    repeats = report["setup"]["step_ms_of_each_repeat"]
    for key, steps in repeats.items():  # the fastest of the interleaved repeats is reported
        assert len(steps) == 1 and report[key]["step_ms"] == min(steps)
    for key in ("horovod_2", "mirrored_2"):
        r = report[key]
        assert r["replicas"] == 2 and r["baseline_step_ms"] == single["step_ms"]
        assert r["throughput_ratio"] == pytest.approx(
            r["samples_per_s"] / single["samples_per_s"], abs=1e-3
        )
        assert r["scaling_efficiency"] == pytest.approx(r["throughput_ratio"] / 2, abs=1e-3)
    allreduce = report["allreduce"]
    assert allreduce["gradient_bytes"] == grad_bytes and allreduce["per_step_ms"] > 0
    assert [b["bytes"] for b in allreduce["buffers"]] == [1 << 16, 1 << 20, 1 << 22, 1 << 24]
    tengbe = report["prediction"]["10GbE"]["allreduce_bound_ms"]
    assert tengbe["2"] == pytest.approx(grad_bytes / 1.25e9 * 1e3, abs=1e-3)
    assert tengbe["64"] == pytest.approx(2 * 63 / 64 * grad_bytes / 1.25e9 * 1e3, abs=1e-3)
