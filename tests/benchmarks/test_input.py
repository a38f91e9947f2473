"""`keras-dl bench input --quick`: every path measured on generated tables, JSON out."""

import json
import os
import re

import pytest

from benchmarks.timing import measure_rounds, summarize
from tests.conftest import STARTS_FIRST, run_cli
from tests.warm_python import REAL_PYTHON

TABULAR = {
    "raw_pyarrow",
    "reader_alone",
    "in_memory",
    "in_memory_cache",
    "tfdata_floor",
    "stock_unbatch",
    "stock_rebatch",
    "in_memory_permuted",
    "hand_written",
    "ray_to_tf",
    "ray_iter",
    "keras_dl",
    "keras_dl_cached",
}
SUBJECTS = {"keras_dl", "keras_dl_cached"}


def test_summary_has_medians_spreads_and_per_round_ratios():
    calls = []
    samples = measure_rounds(
        3,
        {
            "keras_dl": lambda: calls.append("k") or 8.0 + len(calls),
            "base": lambda: calls.append("b") or 10.0,
        },
    )
    assert calls == ["k", "b"] * 3  # interleaved: round 1 of every path, then round 2 ...
    s = summarize(samples, scale=2e6)
    assert s["rows_per_s"] == {"keras_dl": 11, "base": 10}  # medians of 9, 11, 13 and 10s
    assert s["spread"]["keras_dl"] == [9, 13] and s["mb_per_s"]["base"] == 20.0
    assert s["ratios"] == {"keras_dl/base": 1.1}
    assert s["ratio_spread"]["keras_dl/base"] == [0.9, 1.3]
    assert "cpu_us_per_unit" not in s  # the lambdas time nothing: no CPU figures
    # A slow path over small rows (Ray on the narrow table, on a loaded CI machine) keeps a
    # non-zero MB/s: significant figures, not one decimal place, which rounded it to 0.0.
    slow = summarize({"keras_dl": [4000.0], "ray": [3000.0, 3100.0]}, scale=16.0)
    assert slow["mb_per_s"] == {"keras_dl": 0.064, "ray": 0.0488}
    # Nor does a rate: a peer stalled for minutes in a quick bench's one round (Ray's second
    # epoch on a loaded CI machine: `bench fit --quick` printed its samples/s as 0).
    stalled = summarize({"keras_dl": [1795.4], "ray": [0.4213]}, unit="samples_per_s")
    assert stalled["samples_per_s"] == {"keras_dl": 1795, "ray": 0.421}
    assert stalled["spread"]["ray"] == [0.421, 0.421] and stalled["rounds"]["ray"] == [0.421]


def test_a_baseline_that_measured_zero_gives_no_ratio_and_misses_its_target():
    from benchmarks.input import _check_targets
    from benchmarks.timing import format_targets

    # A peer that did no work in any round (its rate 0): no ZeroDivisionError, no inf in the
    # JSON, and its target printed as n/a and missed; a round of 0 is left out of the spread.
    s = summarize({"keras_dl": [900.0, 1000.0], "ray": [0.0, 0.0], "base": [0.0, 500.0]})
    assert s["ratios"] == {"keras_dl/ray": None, "keras_dl/base": 3.8}
    assert s["ratio_spread"] == {"keras_dl/ray": [], "keras_dl/base": [2.0, 2.0]}
    json.dumps(s, allow_nan=False)
    unmeasured = {
        "ratios": {"keras_dl/ray_to_tf": None},
        "ratio_spread": {"keras_dl/ray_to_tf": []},
    }
    report = {"narrow": {"batches": {"32": unmeasured}}}
    (target,) = _check_targets(report)
    assert target["value"] is None and target["met"] is False
    line = format_targets([target]).splitlines()[1]
    assert "n/a" in line and "FAIL" in line and "None" not in line


def test_cpu_per_unit_comes_from_the_timed_window():
    from benchmarks import timing

    def busy():
        end = timing.time.perf_counter() + 0.001
        while timing.time.perf_counter() < end:
            pass
        return 1

    cpu: dict = {}
    # 0.3 s windows: os.times() counts CPU in 10 ms ticks, and on a loaded host (parallel test
    # workers) a 50 ms window could be descheduled long enough to count none.
    samples = measure_rounds(3, {"keras_dl": lambda: timing.timed_loop(busy, 0.3)}, cpu)
    assert len(cpu["keras_dl"]) == 3
    s = summarize({**samples, "base": [1.0] * 3}, cpu={**cpu, "base": [2000.0] * 3})
    assert s["cpu_us_per_unit"]["keras_dl"] > 0  # no bound: other load deschedules the loop
    assert s["cpu_ratios"]["keras_dl/base"] == round(s["cpu_us_per_unit"]["keras_dl"] / 2000, 3)
    assert s["cores_per_10k_per_s"]["base"] == 20.0  # 2 ms of CPU a row: 20 cores for 10k rows/s


RAY = {"ray_to_tf", "ray_iter"}


def _quick_bench(tmp_path, *args):
    out = tmp_path / "bench.json"
    done = run_cli("bench", "input", "--quick", *args, "--out", str(out), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout[done.stdout.index("{") :]) == report
    return done, report


def _check_paths(report, table, paths):
    """Every path of ``table`` measured at both batch sizes, beside every baseline, with its
    CPU per row; the tabular tables train every row once per epoch."""
    assert set(report[table]["batches"]) == {"32", "256"}
    for figures in report[table]["batches"].values():
        timed, shown = set(paths), set(paths)
        if table != "images":  # every row trains once per epoch, at every batch size
            assert figures["rows_trained_per_epoch_fraction"] == 1.0
            # The streaming ceiling: per round, the slower of decoding and the tf.data floor.
            rounds = figures["rounds"]
            assert rounds["limit"] == [
                min(a, b) for a, b in zip(rounds["raw_pyarrow"], rounds["tfdata_floor"])
            ]
            shown.add("limit")
            if "tfdata_floor_packed" in paths:  # the packed path's own ceiling
                assert rounds["limit_packed"] == [
                    min(a, b) for a, b in zip(rounds["raw_pyarrow"], rounds["tfdata_floor_packed"])
                ]
                shown.add("limit_packed")
        assert set(figures["rows_per_s"]) == set(figures["spread"]) == shown
        assert all(v > 0 for v in figures["rows_per_s"].values())
        assert all(v > 0 for v in figures["mb_per_s"].values())
        subjects = SUBJECTS | ({"keras_dl_packed", "keras_dl_packed_cached"} & paths)
        ratios = {f"{s}/{p}" for s in subjects for p in shown - subjects}
        assert set(figures["ratios"]) == set(figures["ratio_spread"]) == ratios
        assert set(figures["cpu_us_per_unit"]) == timed
        assert all(v > 0 for v in figures["cpu_us_per_unit"].values())
        cores = figures["cores_per_10k_per_s"]  # CPU per row times 10,000 rows a second
        assert set(cores) == timed
        assert all(abs(cores[n] * 100 - figures["cpu_us_per_unit"][n]) < 0.06 for n in timed)


def _tabular_targets(streaming, cached, limit, peers):
    return {
        *(f"{s}/{limit}" for s in streaming),
        *(f"{s}/in_memory_permuted" for s in cached),
        *(f"{s}/{p}" for s in streaming + cached for p in peers),
    }


def _check_targets(report, expected):
    names = {(t["table"], t.get("batch"), t["ratio"]) for t in report["targets"]}
    assert names == expected
    for t in report["targets"]:  # a target is met exactly when its figure reaches it
        if isinstance(t["target"], float):
            assert t["met"] == (t["value"] >= t["target"]), t
    assert all(isinstance(t["met"], bool) for t in report["targets"])


# The quick bench runs as two tests, on two workers: the narrow table with the Ray Data peers
# and the peak-RSS children, and the wide and image tables without Ray (the same peer code).


@STARTS_FIRST
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard: about 120 s quiet, over 900 on a CI machine loaded 5x
def test_quick_bench_narrow_beside_ray_and_stock_tf_data_with_its_memory(tmp_path):
    done, report = _quick_bench(tmp_path, "--tables", "narrow")
    assert set(report) == {"config", "narrow", "rss", "targets"} and report["config"]["ray"]
    # Ray's workers (nice 15 by Ray's default) run at the bench's own priority, as every feed
    assert report["config"]["ray_worker_niceness"] == os.getpriority(os.PRIO_PROCESS, 0)
    _check_paths(report, "narrow", TABULAR)
    rss = report["rss"]
    assert rss["rows_8x"] == 8 * rss["rows_1x"] and rss["peak_rss_mb_1x"] > 100
    targets = {
        "rows trained per epoch / rows",
        *_tabular_targets(
            ["keras_dl"], ["keras_dl_cached"], "limit", ("stock_rebatch", "ray_to_tf", "ray_iter")
        ),
    }
    _check_targets(
        report,
        {
            *(("narrow", b, r) for b in (32, 256) for r in targets),
            ("narrow", None, "rss_8x/rss_1x - 1"),
        },
    )
    assert re.search(r"^narrow +32 +keras_dl/ray_to_tf ", done.stderr, re.M)  # targets table
    assert "cores to feed 10,000 rows/s" in done.stderr


@STARTS_FIRST
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang guard: about 120 s quiet, over 900 on a CI machine loaded 5x
def test_quick_bench_wide_and_images_report_every_path_beside_its_baseline(tmp_path):
    done, report = _quick_bench(tmp_path, "--tables", "wide,images,mixed", "--no-ray")
    assert set(report) == {"config", "wide", "images", "mixed", "targets"}
    assert not report["config"]["ray"]  # --no-ray: no Ray peers, and no targets against them
    packed = {"keras_dl_packed", "keras_dl_packed_cached", "tfdata_floor_packed"}
    _check_paths(report, "wide", (TABULAR - RAY) | packed)
    _check_paths(report, "images", {"petastorm_codec", "in_memory_decode", *SUBJECTS})
    profile = report["wide"]["profile"]
    for stages in (profile["stages"], profile["stages_packed"]):
        assert set(stages) == {"32", "256"}
        assert set(stages["32"]) == {"reader", "+convert", "+shuffle", "+from_generator", "+slice"}
        assert all(v > 0 for v in stages["32"].values())
    assert profile["generator"]["rows_per_s"] > 0 and profile["generator"]["top_own_time"]
    # Who spent the packed streaming path's CPU, and Petastorm's reader against a plain pool.
    for batch in ("32", "256"):
        threads = profile["threads_packed"][batch]
        parts = threads["cpu_us_per_row"]
        assert parts["reader_workers_load_and_convert"] > 0
        assert parts["generator_shuffle_and_blocks"] > 0
        assert abs(sum(parts.values()) - threads["cpu_us_per_row_total"]) < 0.01
        machinery = profile["machinery_packed"][batch]
        assert set(machinery["rows_per_s"]) == {"petastorm_reader", "plain_thread_pool"}
        assert machinery["ratios"]["petastorm_reader/plain_thread_pool"] > 0
    assert "Petastorm reader / plain thread pool" in done.stderr
    peers = ("stock_rebatch",)
    wide = {
        "rows trained per epoch / rows",
        *_tabular_targets(["keras_dl"], ["keras_dl_cached"], "limit", peers),
        *_tabular_targets(["keras_dl_packed"], ["keras_dl_packed_cached"], "limit_packed", peers),
    }
    images = {
        "keras_dl/in_memory_decode",
        "keras_dl/petastorm_codec",
        "keras_dl_cached/in_memory_decode",
    }
    _check_targets(
        report,
        {
            *(("wide", b, r) for b in (32, 256) for r in wide),
            *(("images", b, r) for b in (32, 256) for r in images),
            *(("mixed", b, "mixed/slower_table") for b in (32, 256)),
        },
    )
    # Two tables mixed by weight beside each alone, in the same rounds, with CPU per row.
    assert report["mixed"]["rows"] == {"table_a": 5_000, "table_b": 5_000, "mixed": 10_000}
    for figures in report["mixed"]["batches"].values():
        assert set(figures["rows_per_s"]) == {"mixed", "table_a", "table_b"}
        assert all(v > 0 for v in figures["rows_per_s"].values())
        assert set(figures["cpu_us_per_unit"]) == {"mixed", "table_a", "table_b"}
        assert figures["ratios"]["mixed/slower_table"] > 0
    assert re.search(r"^mixed +256 +mixed/slower_table ", done.stderr, re.M)
    assert re.search(r"^wide +32 +keras_dl_packed/stock_rebatch ", done.stderr, re.M)
    assert "cores to feed 10,000 rows/s" in done.stderr
    assert re.search(r"^wide +256 .*keras_dl_cached \d", done.stderr, re.M), done.stderr[-2000:]


def test_bench_plan_plans_every_rank_from_the_log_alone(tmp_path):
    out = tmp_path / "plan.json"
    done = run_cli("bench", "plan", "--files", "300", "--ranks", "16", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    planning = report["planning"]
    # The log names 300 files that do not exist: planning read none of them.
    assert planning["rows_sum_over_ranks"] == planning["rows"] and planning["footers_opened"] == 0
    low, high = planning["rows_per_rank_min_max"]
    assert high - low <= 1 and planning["target_met"] is True
    layouts = report["layouts"]
    assert {row["row_exact_fraction_trained"] for row in layouts} == {1.0}
    assert any(row["old_rule_fraction_trained"] == "refused" for row in layouts)
    resume = report["resume"]  # an epoch stopped halfway on 16 ranks, resumed on 12
    assert (resume["stopped_on_ranks"], resume["resumed_on_ranks"]) == (16, 12)
    assert resume["data_position_bytes"] < 100
    done_steps, steps = resume["steps_done_of_epoch"]
    assert resume["rows_trained_before"] == 16 * resume["batch_per_rank"] * done_steps
    assert 0 < done_steps < steps and resume["resume_plan_seconds_median"] > 0


def test_cpu_of_child_processes_counts_only_within_counting_descendants():
    """Ray's workers are processes of their own: their CPU per row must be counted."""
    import subprocess
    import time

    from benchmarks import timing

    burn = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    child = subprocess.Popen([REAL_PYTHON, "-c", burn])  # its own child
    try:
        time.sleep(0.3)  # the child is running
        before = timing.cpu_seconds()
        time.sleep(1.0)
        alone = timing.cpu_seconds() - before
        with timing.counting_descendants():
            before = timing.cpu_seconds()
            time.sleep(1.0)
            counted = timing.cpu_seconds() - before
        assert not timing._descendants  # reset on exit
    finally:
        child.kill()
        child.wait()
    assert alone < 0.1  # this process slept
    assert counted > 0.1 + alone  # the child's busy loop, even on a loaded machine


def test_a_child_that_exits_keeps_its_cpu_counted():
    """A Ray worker exiting inside a timed window made the window's CPU negative (CI saw
    ray_iter at -75.5 µs per row): the sum over live descendants dropped by its whole CPU."""
    import subprocess
    import time

    from benchmarks import timing

    # 0.3 s of its own CPU, however loaded the machine (a loop on the clock's 0.5 s got only
    # 0.09 CPU-s beside a full suite on 2 cores)
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    with timing.counting_descendants():
        child = subprocess.Popen([REAL_PYTHON, "-c", burn])  # its own child
        readings = []
        while child.poll() is None:
            readings.append(timing.cpu_seconds())
            time.sleep(0.05)  # this process mostly sleeps: the CPU counted is the child's
        child.wait()
        readings.append(timing.cpu_seconds())  # the child is gone
    assert readings == sorted(readings)  # never decreasing
    assert readings[-1] - readings[0] > 0.1  # the child's busy loop stays counted
