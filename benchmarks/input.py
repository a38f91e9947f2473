"""Input pipeline benchmark: keras_dl's reader beside the limits, Petastorm, Ray Data, a
hand-written pyarrow pipeline and in-memory tf.data.

Generates a narrow, a wide and an image table, and measures every path on the same data in one
run, consuming each dataset inside a ``tf.function`` the way ``fit`` does (the peers are in
:mod:`benchmarks.input_peers`). Every figure is the
median of at least 3 interleaved repeats, each timed over at least 2 s, with its min-max spread
(see :mod:`benchmarks.timing`). Prints JSON: rows/s (and MB/s) per path at each batch size,
keras_dl's ratio to each baseline, the targets with pass/fail, a profile of the wide table, and
peak RSS of keras_dl at 1x and 8x the narrow table (separate processes). The targets are also
printed to stderr as a table.

    keras-dl bench input            # ~1M-row narrow table: a few minutes on 2 cores
    keras-dl bench input --quick    # small sizes, a smoke test
    keras-dl bench input --store s3 --latency-ms 40   # from S3 at latency (benchmarks.input_remote)
    keras-dl bench input --store azure --latency-ms 40   # from Azurite (abfss://) at latency
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SIZES = {
    "full": {"narrow": 1_000_000, "wide": 100_000, "images": 3_000, "mixed": 500_000},
    "quick": {"narrow": 10_000, "wide": 1_000, "images": 256, "mixed": 5_000},
}
ROWS_PER_GROUP = {"narrow": 65_536, "wide": 8_192, "images": 256, "mixed": 65_536}
QUICK_ROWS_PER_GROUP = {"narrow": 2_048, "wide": 256, "images": 64, "mixed": 1_024}
# Ratio name: minimum, of the medians, at every batch size; the worst batch size counts
# (issue 25). "limit" is, per round, the slower of raw pyarrow decoding the table and the
# tf.data floor (one batch handed over again and again): no streaming path can beat both;
# "limit_packed" the same with the floor's batch packed. keras_dl with data.pack_features
# (``keras_dl_packed``: tables with columns to pack) is held to it, and to the same cached and
# peer targets as keras_dl.
STREAMING, CACHED = ("keras_dl", "keras_dl_packed"), ("keras_dl_cached", "keras_dl_packed_cached")
TABULAR_TARGETS = {
    "keras_dl/limit": 0.8,
    # Packed batches (a few (B, k) tensors) hand over faster than 200 (B,) ones: the packed
    # path is held to the slower of decoding and the floor of batches shaped as it yields them.
    "keras_dl_packed/limit_packed": 0.8,
    # The fair cached baseline: the table in memory, a new permutation gathered each epoch.
    **{f"{subject}/in_memory_permuted": 0.9 for subject in CACHED},
    **{
        f"{subject}/{peer}": 1.0
        for subject in STREAMING + CACHED
        for peer in ("stock_rebatch", "ray_to_tf", "ray_iter")
    },
}
IMAGE_TARGETS = {
    "keras_dl/in_memory_decode": 0.9,
    "keras_dl/petastorm_codec": 3.0,
    # The same, as a run gets it by default (data.cache=auto: the encoded bytes in memory).
    "keras_dl_cached/in_memory_decode": 0.9,
}
# Two tables mixed by weight (data.sources) against the slower of them alone, per round.
MIXED_TARGETS = {"mixed/slower_table": 0.9}
RSS_TOLERANCE = 0.15


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl bench input`` arguments."""
    p.add_argument("--quick", action="store_true", help="small tables: a smoke test")
    p.add_argument("--dir", default=None, help="where to write the tables (default: a temp dir)")
    p.add_argument("--batch-sizes", default="32,256", help="comma-separated (default: 32,256)")
    p.add_argument(
        "--tables",
        default=None,
        help="which tables to measure (default: narrow,wide,images,mixed; mixed: two narrow "
        "tables mixed by weight beside each alone; with --store s3|azure: floats40,wide)",
    )
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    p.add_argument(
        "--no-ray", action="store_true", help="leave out the Ray Data peers (the bench extra)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved repeats of every figure, median reported (default and minimum: 3; "
        "quick 1)",
    )
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    p.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    from benchmarks import input_remote

    input_remote.add_arguments(p)  # --store, --latency-ms


def run(args) -> int:
    """Generate the tables, measure every path, print the JSON report."""
    if args.rss_child:
        return _rss_child(args.rss_child)
    if getattr(args, "store", "local") != "local":
        from benchmarks import input_remote

        return input_remote.run(args)
    from benchmarks import input_images as images
    from benchmarks import input_machinery as machinery
    from benchmarks import input_paths as paths
    from benchmarks import input_peers as peers
    from benchmarks import input_profile as profile
    from benchmarks import input_tables as tables
    from benchmarks import timing

    size = SIZES["quick" if args.quick else "full"]
    groups = QUICK_ROWS_PER_GROUP if args.quick else ROWS_PER_GROUP
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.quick:
        rounds = args.rounds or 1
        timing.MIN_SECONDS = 0.2  # a smoke test: the figures are not meant to be read
    else:
        rounds = max(args.rounds or timing.MIN_ROUNDS, timing.MIN_ROUNDS)
    wanted = (args.tables or "narrow,wide,images,mixed").split(",")
    work = args.dir or tempfile.mkdtemp(prefix="keras_dl_bench_input_")
    os.makedirs(work, exist_ok=True)
    report: dict = {
        "config": {
            "mode": "quick" if args.quick else "full",
            "rows": size,
            "rows_per_group": groups,
            "batch_sizes": batches,
            "rounds": rounds,
            "min_seconds_per_figure": timing.MIN_SECONDS,
            "cpus": os.cpu_count(),
            "unit": "rows/s (images: images/s), consumed inside a tf.function",
            "figures": "median of the rounds; spread: [min, max]; ratios: of the medians",
            "command": " ".join(["keras-dl", *sys.argv[1:]]) if sys.argv else "",
        }
    }
    ray = not args.no_ray and bool({"narrow", "wide"} & set(wanted))
    try:
        with peers.ray_for_report(report["config"], ray):
            if "narrow" in wanted:
                t = tables.write_narrow(f"{work}/narrow", size["narrow"], groups["narrow"])
                report["narrow"] = paths.measure_tabular(t, batches, None, rounds, ray)
            if "wide" in wanted:
                t = tables.write_wide(f"{work}/wide", size["wide"], groups["wide"])
                report["wide"] = paths.measure_tabular(t, batches, None, rounds, ray)
                report["wide"]["profile"] = {
                    "stages": {str(b): profile.profile_stages(t, b) for b in batches},
                    "stages_packed": {
                        str(b): profile.profile_stages(t, b, pack=True) for b in batches
                    },
                    "generator": profile.profile_generator(t),
                    # Packed, the path held to the decode limit: who spends its CPU, and what
                    # Petastorm's reader machinery costs against a plain thread pool.
                    "threads_packed": {str(b): machinery.thread_cpu(t, b, True) for b in batches},
                    "machinery_packed": {
                        str(b): machinery.reader_machinery(t, b, rounds, True) for b in batches
                    },
                }
        if "images" in wanted:
            url, delta = tables.write_images(work, size["images"], groups["images"])
            report["images"] = images.measure_images(url, delta, batches, rounds)
        if "mixed" in wanted:
            from benchmarks.input_mixed import measure_mixed

            report["mixed"] = measure_mixed(work, size["mixed"], groups["mixed"], batches, rounds)
        if "narrow" in wanted and not args.no_rss:
            report["rss"] = _measure_rss(work, size["narrow"], groups["narrow"], tables)
        report["targets"] = _check_targets(report)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(timing.format_targets(report["targets"]), file=sys.stderr)
    print(format_cores(report), file=sys.stderr)
    if "profile" in report.get("wide", {}):
        print(format_profile(report["wide"]["profile"]), file=sys.stderr)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def format_cores(report: dict) -> str:
    """Per table and batch size, each path's CPU cores to feed 10,000 rows (images) a second:
    its CPU per row, all threads counted. A GPU node has about 8-16 cores per GPU."""
    lines = ["cores to feed 10,000 rows/s (images/s), from CPU per row:"]
    for table in SIZES["full"]:
        for batch, figures in report.get(table, {}).get("batches", {}).items():
            cores = figures.get("cores_per_10k_per_s", {})
            if cores:
                paths = "  ".join(f"{n} {c:g}" for n, c in sorted(cores.items()))
                lines.append(f"{table:8s} {batch:>5s}  {paths}")
    return "\n".join(lines)


def format_profile(profile: dict) -> str:
    """The wide table's packed streaming path, per batch size: CPU per row by who spent it, the
    cores kept busy, and Petastorm's reader against a plain thread pool doing the same work."""
    lines = ["wide, packed streaming: CPU us/row by thread; Petastorm reader / plain thread pool:"]
    for batch, t in profile.get("threads_packed", {}).items():
        parts = "  ".join(f"{k} {v:g}" for k, v in t["cpu_us_per_row"].items())
        m = profile["machinery_packed"][batch]
        ratio = m["ratios"]["petastorm_reader/plain_thread_pool"]
        spread = m["ratio_spread"]["petastorm_reader/plain_thread_pool"]
        lines.append(
            f"{batch:>5s}  {t['rows_per_s']} rows/s, {t['cpu_us_per_row_total']:g} us/row on "
            f"{t['busy_cores']:g} busy cores: {parts}; reader / pool "
            f"{'n/a' if ratio is None else f'{ratio:.2f}'} "
            f"({'-'.join(f'{x:.2f}' for x in spread) or 'no round measured'})"
        )
    return "\n".join(lines)


def _check_targets(report: dict) -> list[dict]:
    from benchmarks import timing

    out = []
    for table in SIZES["full"]:
        targets = {"images": IMAGE_TARGETS, "mixed": MIXED_TARGETS}.get(table, TABULAR_TARGETS)
        for batch, figures in report.get(table, {}).get("batches", {}).items():
            for name, minimum in targets.items():
                if name not in figures["ratios"]:
                    continue  # a pair this table's run does not measure
                value, met = timing.judged(figures["ratios"][name], minimum)
                out.append(
                    {
                        "table": table,
                        "batch": int(batch),
                        "ratio": name,
                        "value": value,
                        "spread": figures["ratio_spread"][name],
                        "target": minimum,
                        "met": met,
                        # The same pair's CPU per row (all threads): lower is cheaper.
                        "cpu_ratio": figures.get("cpu_ratios", {}).get(name),
                    }
                )
            trained = figures.get("rows_trained_per_epoch_fraction")
            if trained is not None:  # every row once per epoch (the row-exact shards)
                out.append(
                    {
                        "table": table,
                        "batch": int(batch),
                        "ratio": "rows trained per epoch / rows",
                        "value": trained,
                        "target": 1.0,
                        "met": trained == 1.0,
                    }
                )
    rss = report.get("rss")
    if rss:
        growth = rss["peak_rss_mb_8x"] / rss["peak_rss_mb_1x"] - 1
        out.append(
            {
                "table": "narrow",
                "ratio": "rss_8x/rss_1x - 1",
                "value": round(growth, 3),
                "target": f"<= {RSS_TOLERANCE}",
                "met": growth <= RSS_TOLERANCE,
            }
        )
    return out


def _measure_rss(work: str, rows: int, rows_per_group: int, tables) -> dict:
    """Peak RSS of keras_dl reading the narrow table at 1x and 8x, each in a fresh process."""
    out = {}
    for factor in (1, 8):
        path = f"{work}/narrow_rss_{factor}x"
        tables.write_narrow(path, rows * factor, rows_per_group, seed=factor)
        cmd = [sys.executable, "-m", "keras_dl.cli", "bench", "input", "--rss-child", path]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"RSS child failed: {done.stderr[-2000:]}")
        child = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"peak_rss_mb_{factor}x"] = child["peak_rss_mb"]
        out[f"rows_{factor}x"] = child["rows"]
        out[f"seconds_{factor}x"] = child["seconds"]
        shutil.rmtree(path, ignore_errors=True)
    out["ratio_8x_to_1x"] = round(out["peak_rss_mb_8x"] / out["peak_rss_mb_1x"], 3)
    return out


def _rss_child(path: str) -> int:
    """One epoch of keras_dl's training pipeline over ``path``; print peak RSS as JSON."""
    from benchmarks.input_paths import keras_dl_dataset
    from benchmarks.timing import consume

    split = keras_dl_dataset(path, batch=256, label=None)
    start = time.perf_counter()
    consume(split.dataset, split.steps)
    seconds = time.perf_counter() - start
    print(json.dumps({"peak_rss_mb": _peak_rss_mb(), "rows": split.stats.rows, "seconds": seconds}))
    return 0


def _peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries the pre-exec peak into it, so a child forked
    from this 2 GB benchmark process would report the parent's memory as its own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
