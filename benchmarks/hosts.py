"""``keras-dl bench hosts``: each engine's training speed on one and on two hosts.

The hosts are the suite's (``tests/fixtures/hosts.py``): network namespaces on this machine,
each with its own name, address, ``/etc/hosts`` (its own name on loopback, as on a default
Linux install) and local folder, a Spark standalone master and a worker per host, and moto's S3
and an MLflow server on a host of their own. So it needs root and a source checkout with the dev
extra (``make setup``). Digits is ingested into the cluster's S3 once; then each setup
``ENGINE:NP`` (``horovod:1``, ``multiworker:2``, ...) runs ``keras-dl train digits --set
runtime.strategy=ENGINE --set runtime.np=NP`` from host 1, the setups interleaved, ``--rounds``
times.

Printed (JSON): per setup the median ``samples_per_sec`` of its epochs after the first (MLflow's
figure, summed over the ranks), the spread over rounds, the wall time of the whole command, and
the machine's CPU time per trained row over the whole command (``/proc/stat``: every process of
every host, Spark's JVMs and start-up included, so this is the cost of a run, not of a step);
each beside the baseline ``horovod:1`` as a ratio. Every host shares this machine's cores, so two
hosts are a regression figure, not a scaling one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.timing import summarize

SETUPS = ("horovod:1", "multiworker:1", "horovod:2", "multiworker:2")
BASELINE = "horovod:1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``keras-dl bench hosts``."""
    parser.add_argument(
        "--epochs", type=int, default=4, help="epochs per run (the first is not timed)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs of every setup")
    parser.add_argument(
        "--setups", default=",".join(SETUPS), help=f"ENGINE:NP, comma-separated (default {SETUPS})"
    )
    parser.add_argument("--out", default=None, help="also write the JSON report to this file")


def run(args) -> int:
    """Build the cluster, run every setup ``--rounds`` times, print JSON; 1 if a run failed."""
    from tests.conftest import REPO
    from tests.distribute.hosts_driver import store_on, train_command
    from tests.distribute.test_hosts_horovod import ingest_digits
    from tests.fixtures.cluster import HostCluster
    from tests.fixtures.hosts import Network

    setups = [parse_setup(s) for s in args.setups.split(",") if s.strip()]
    hosts = max(np for _, np in setups)
    network = Network(Path(tempfile.mkdtemp(prefix="keras-dl-bench-hosts-")), hosts)
    runs: list[dict] = []
    try:
        cluster = HostCluster(network)
        h1 = network.hosts[0]
        ingest_digits(cluster, h1, cluster.s3_uri("digits"))
        for round_ in range(args.rounds):
            for engine, np in setups:
                name = f"{engine}:{np}"
                run_dir = cluster.s3_uri(f"runs/{engine}-{np}-{round_}")
                cmd = train_command(
                    engine, np, cluster.s3_uri("digits"), cluster.tracking_uri, run_dir,
                    f"train.epochs={args.epochs}", "tracking.registered_model=",
                )  # fmt: skip
                cpu, wall = busy_seconds(), time.monotonic()
                done = h1.run(cmd, env=cluster.env(h1), cwd=REPO, timeout=1800)
                wall, cpu = time.monotonic() - wall, busy_seconds() - cpu
                if done.returncode:
                    print(done.stdout[-3000:], done.stderr[-5000:])
                    print(f"{name} (round {round_ + 1}) failed: exit {done.returncode}")
                    return 1
                runs.append({"setup": name, "run_dir": run_dir, "wall_s": wall, "cpu_s": cpu})
                print(f"{name} round {round_ + 1}: {wall:.0f} s", flush=True)
        logged = {r["params"].get("runtime.run_dir"): r for r in store_on(cluster, h1)["runs"]}
    finally:
        network.close()
    report = build_report(runs, logged, args.epochs)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def parse_setup(text: str) -> tuple[str, int]:
    """``"multiworker:2"`` as ``("multiworker", 2)``.

    Raises:
        SystemExit: For an engine other than horovod or multiworker, or NP below 1.
    """
    engine, _, np = text.strip().partition(":")
    if engine not in ("horovod", "multiworker") or not np.isdigit() or int(np) < 1:
        raise SystemExit(
            f"--setups: {text!r} is not ENGINE:NP with ENGINE horovod or multiworker and NP >= 1 "
            "(one Spark task per host), e.g. horovod:2."
        )
    return engine, int(np)


def busy_seconds() -> float:
    """CPU seconds the machine has spent busy since boot (``/proc/stat``: all but idle and
    iowait), for the CPU of processes in every namespace at once."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def build_report(runs: list[dict], logged: dict, epochs: int) -> dict:
    """The figures of ``runs`` (each with the MLflow run ``logged`` under its run folder)."""
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    for r in runs:
        run = logged[r["run_dir"]]
        per_epoch = [v for _, v in sorted(run["metrics"].get("samples_per_sec", []))]
        rows = int(run["params"]["data.train_rows"]) * epochs
        rates.setdefault(r["setup"], []).append(statistics.median(per_epoch[1:] or per_epoch))
        cpu.setdefault(r["setup"], []).append(r["cpu_s"] * 1e6 / rows)
        walls.setdefault(r["setup"], []).append(round(r["wall_s"], 1))
    subjects = tuple(s for s in rates if s != BASELINE)
    out = summarize(rates, subjects, unit="samples_per_s", cpu=cpu)
    out.pop("mb_per_s", None)
    out.pop("cores_per_10k_per_s", None)  # a whole run's CPU, not a step's: no sizing figure
    out["wall_s"] = walls
    out["baseline"] = BASELINE
    out["note"] = (
        "samples_per_s: median over epochs 2.. of MLflow's samples_per_sec; cpu_us_per_unit: "
        "the machine's busy CPU over the whole command per trained row (start-up included); "
        "every host shares this machine's cores (regression figures, not scaling)"
    )
    return out
