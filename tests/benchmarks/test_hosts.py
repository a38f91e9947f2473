"""``keras-dl bench hosts``'s report, from figures as the cluster's MLflow server returns them
(the bench itself builds a cluster of hosts and trains 4 times: minutes, run by hand)."""

from __future__ import annotations

import pytest

from benchmarks.hosts import build_report, parse_setup


def _logged(run_dir: str, rates: list[float], rows: int = 1000) -> dict:
    history = [(step, rate) for step, rate in enumerate(rates)]
    params = {"runtime.run_dir": run_dir, "data.train_rows": str(rows)}
    return {"params": params, "metrics": {"samples_per_sec": history}}


def test_each_setup_beside_horovod_on_one_host_with_cpu_per_row():
    runs = [
        {"setup": "horovod:1", "run_dir": "a", "wall_s": 60.0, "cpu_s": 40.0},
        {"setup": "multiworker:2", "run_dir": "b", "wall_s": 90.0, "cpu_s": 100.0},
        {"setup": "horovod:1", "run_dir": "c", "wall_s": 62.0, "cpu_s": 44.0},
        {"setup": "multiworker:2", "run_dir": "d", "wall_s": 88.0, "cpu_s": 80.0},
    ]
    logged = {
        "a": _logged("a", [50, 1000, 1200, 1100]),  # the first epoch (start-up) is not timed
        "b": _logged("b", [10, 500, 600, 550]),
        "c": _logged("c", [50, 900, 1000, 950]),
        "d": _logged("d", [10, 450, 450, 450]),
    }
    report = build_report(runs, logged, epochs=4)
    assert report["baseline"] == "horovod:1"
    assert report["samples_per_s"] == {"horovod:1": 1025, "multiworker:2": 500}
    assert report["spread"]["multiworker:2"] == [450, 550]
    assert report["ratios"] == {"multiworker:2/horovod:1": round(500 / 1025, 3)}
    # The machine's CPU over the whole command, per row trained (4 epochs of 1,000 rows).
    assert report["cpu_us_per_unit"] == {"horovod:1": 10500.0, "multiworker:2": 22500.0}
    assert report["cpu_ratios"] == {"multiworker:2/horovod:1": round(22500 / 10500, 3)}
    assert report["wall_s"] == {"horovod:1": [60.0, 62.0], "multiworker:2": [90.0, 88.0]}


def test_a_setup_names_its_engine_and_tasks():
    assert parse_setup(" multiworker:2") == ("multiworker", 2)
    for bad in ("mirrored:1", "horovod", "horovod:0", "horovod:-2"):
        with pytest.raises(SystemExit, match="ENGINE:NP"):
            parse_setup(bad)
