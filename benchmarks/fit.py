"""Fit benchmark: ``model.fit`` fed by keras_dl from a Delta table against the same fit from memory.

What a user feels is the speed of training, not of the reader. This trains one compute-bound
Keras model per table for a fixed number of steps, fed five ways (three without Ray) with identical batches (same
structure, same batch size):

- ``keras_dl``: keras_dl's training pipeline over the Delta table (read, shuffle, decode), as a
  run gets it: with ``data.cache=auto`` these tables fit, so the second epoch reads no table
  (and, the image hook being deterministic, decodes no JPEG: the cache holds decoded images);
- ``keras_dl_stream``: the same with ``data.cache=never``: every epoch read from the table;
- ``in_memory``: the same rows, already decoded, as in-memory tensors sliced a batch at a time;
- the peers a user would pick instead (:func:`benchmarks.fit_feeds.peer_feed`):
  ``hand_written`` (pyarrow ``iter_batches`` into ``from_generator``) and ``ray_to_tf`` (Ray
  Data's ``read_parquet(files).to_tf``, left out by ``--no-ray``), the images decoded in tf.data.

Models: an MLP on the wide table (200 float columns), the same MLP taking them packed
(``mlp_wide_packed``: ``data.pack_features``, the tabular recipe's default), and a small CNN on
64x64 JPEGs. Every
round fits each feed for two epochs of one pass over the table each and keeps the second (the
first traces the step, starts the reader and fills the cache); rounds are interleaved.
Prints JSON: samples/s, CPU ms per sample (all threads: steadier than wall time on a shared
machine) and ``input_wait_fraction`` (:class:`keras_dl.callbacks.Throughput`)
per feed as medians with min-max spreads, keras_dl's ratio to each other feed, and the targets
(keras_dl/in_memory >= 0.95 with CPU per sample within 3 %, keras_dl/peer >= 1.0).

    keras-dl bench fit              # a few minutes on 2 cores
    keras-dl bench fit --quick      # tiny tables and epochs: a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

TARGET = 0.95  # keras_dl's samples/s over in-memory's, median
CPU_TOLERANCE = 0.03  # keras_dl's CPU per sample at most this much above in-memory's
PEER_TARGET = 1.0  # keras_dl's samples/s over each peer's (hand-written, Ray Data)
SETUPS = {
    # name: (table, rows full, rows quick, rows per group full, quick, batch); "_packed": the
    # model takes the columns packed (data.pack_features), and every feed hands them so
    "mlp_wide": ("wide", 50_000, 512, 8_192, 256, 256),
    "mlp_wide_packed": ("wide", 50_000, 512, 8_192, 256, 256),
    "cnn_images": ("images", 3_000, 128, 256, 64, 64),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl bench fit`` arguments."""
    p.add_argument("--quick", action="store_true", help="tiny tables and epochs: a smoke test")
    p.add_argument("--models", default=",".join(SETUPS), help="which setups to run")
    p.add_argument("--dir", default=None, help="where to write the tables (default: a temp dir)")
    p.add_argument("--steps", type=int, default=None, help="steps per epoch (default: 1 pass)")
    p.add_argument("--rounds", type=int, default=None, help="repeats (default and minimum: 3)")
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    p.add_argument(
        "--no-ray", action="store_true", help="leave out the Ray Data feed (the bench extra)"
    )


def run(args) -> int:
    """Write the tables, fit every setup from every feed, print the JSON report."""
    from benchmarks import timing

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.quick:
        rounds = args.rounds or 1
        timing.MIN_SECONDS = 0.2
    else:
        rounds = max(args.rounds or timing.MIN_ROUNDS, timing.MIN_ROUNDS)
    work = args.dir or tempfile.mkdtemp(prefix="keras_dl_bench_fit_")
    os.makedirs(work, exist_ok=True)
    report: dict = {
        "config": {
            "mode": "quick" if args.quick else "full",
            "rounds": rounds,
            "cpus": os.cpu_count(),
            "figures": "median of the rounds' second epochs; spread: [min, max]",
            "command": " ".join(["keras-dl", *sys.argv[1:]]) if sys.argv else "",
        }
    }
    ray = not args.no_ray
    try:
        from benchmarks.input_peers import ray_for_report

        with ray_for_report(report["config"], ray):
            for name in args.models.split(","):
                report[name] = measure_setup(name, work, args.quick, rounds, args.steps, ray)
        report["targets"] = [
            t for name in args.models.split(",") for t in targets(name, report[name])
        ]
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    for t in report["targets"]:
        print(target_line(t), file=sys.stderr)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def targets(setup: str, figures: dict) -> list[dict]:
    """One setup's targets: keras_dl at >= 0.95x in-memory's samples/s, with CPU per sample
    within 3 % of it, and >= 1.0x every peer's samples/s."""
    from benchmarks import timing

    out = []

    def add(ratio, value, spread, target, met):
        out.append(
            {
                "setup": setup,
                "ratio": ratio,
                "value": value,
                "spread": spread,
                "target": target,
                "met": met,
            }
        )

    for name, value in figures["ratios"].items():
        if not name.startswith("keras_dl/") or name == "keras_dl/keras_dl_stream":
            continue
        minimum = TARGET if name == "keras_dl/in_memory" else PEER_TARGET
        shown, met = timing.judged(value, minimum, places=3)
        add(f"{name} samples_per_s", shown, figures["ratio_spread"][name], minimum, met)
    cpu = figures["cpu_ms_per_sample"]
    excess = _cpu_excess(cpu["keras_dl"], cpu["in_memory"])
    add(
        "keras_dl/in_memory cpu_ms_per_sample - 1",
        excess,
        [],
        f"<= {CPU_TOLERANCE}" if excess is not None else "in_memory's CPU measured as 0: no ratio",
        excess is not None and excess <= CPU_TOLERANCE,
    )
    return out


def target_line(t: dict) -> str:
    """One target as the run prints it; a ratio that could not be measured (``None``: its
    baseline was 0) prints as ``n/a``, never ``None`` or ``inf``."""
    value = "n/a" if t["value"] is None else t["value"]
    verdict = "pass" if t["met"] else "FAIL"
    return (
        f"{t['setup']:11s} {t['ratio']} {value} (spread {t['spread']}) "
        f"target {t['target']} {verdict}"
    )


def measure_setup(
    name: str, work: str, quick: bool, rounds: int, steps: int | None = None, ray: bool = False
) -> dict:
    """Fit one setup's model from every feed, ``rounds`` interleaved times; the summary."""
    import statistics

    from benchmarks import fit_feeds, timing

    table, rows, quick_rows, group, quick_group, batch = SETUPS[name]
    pack = name.endswith("_packed")
    path = fit_feeds.write_table(
        table, f"{work}/{name}", quick_rows if quick else rows, quick_group if quick else group
    )
    model = fit_feeds.make_model(table, pack)
    feeds = {
        "keras_dl": lambda: fit_feeds.keras_dl_feed(table, path, batch, pack=pack),
        "keras_dl_stream": lambda: fit_feeds.keras_dl_feed(
            table, path, batch, cache=False, pack=pack
        ),
        "in_memory": fit_feeds.in_memory_feed(table, path, batch, pack),
        "hand_written": lambda: fit_feeds.peer_feed(table, path, batch, "hand_written", pack),
    }
    if ray:
        feeds["ray_to_tf"] = lambda: fit_feeds.peer_feed(table, path, batch, "ray_to_tf", pack)
    # One pass over the table per epoch: the measured (second) epoch is the table's second.
    steps = steps or (quick_rows if quick else rows) // batch
    samples: dict[str, list[dict]] = {n: [] for n in feeds}
    for _ in range(rounds):
        for feed, make in feeds.items():
            # Ray reads in its own processes: count their CPU too.
            with (
                timing.counting_descendants()
                if feed.startswith("ray")
                else contextlib.nullcontext()
            ):
                samples[feed].append(fit_feeds.fit_epochs(model, make(), batch, steps))
    speed = {n: [s["samples_per_sec"] for s in v] for n, v in samples.items()}
    out = timing.summarize(speed, unit="samples_per_s")
    del out["mb_per_s"]
    out["input_wait_fraction"] = {
        n: round(statistics.median(s["input_wait_fraction"] for s in v), 4)
        for n, v in samples.items()
    }
    out["input_wait_fraction_spread"] = {
        n: [round(min(x), 4), round(max(x), 4)]
        for n, v in samples.items()
        for x in [[s["input_wait_fraction"] for s in v]]
    }
    out["cpu_ms_per_sample"] = {
        n: round(statistics.median(s["cpu_ms_per_sample"] for s in v), 3)
        for n, v in samples.items()
    }
    out["step_time_ms"] = {
        n: round(statistics.median(s["step_time_ms"] for s in v), 2) for n, v in samples.items()
    }
    return {"table": table, "model": model.name, "batch": batch, "steps": steps, **out}


def _cpu_excess(keras_dl: float, in_memory: float) -> float | None:
    """keras_dl's CPU per sample over in-memory's, less 1; None when in-memory's rounded to 0
    (a run too short to measure it: the ratio is undefined, and the target is not met)."""
    return round(keras_dl / in_memory - 1, 3) if in_memory > 0 else None
