"""Shard planning at scale, and the rows each epoch trains on ordinary table shapes.

Planning: a synthetic Delta log of ``--files`` add actions (each with ``stats.numRecords``)
whose data files do not exist, so any data-file or footer read would fail. Each of ``--ranks``
ranks replays the log and plans its rows of one shuffled epoch; the benchmark prints the log
replay's time (once per rank in a real job), each rank's planning time (median and max over all
ranks), their sum per rank against the 2 s target, CPU seconds, and checks that the ranks' rows
add up to the table's, each rank within one row of the others.

Resume: the same log's files at ten times their rows (about 10 billion rows, row groups of
125,000), an epoch stopped halfway on ``--ranks`` ranks and resumed on three quarters of them.
It prints the checkpoint's data position in bytes, and a resuming rank's planning (which rows the
stopped ranks trained, the rest cut over the new ranks, this rank's row groups) against planning
a fresh epoch on the new ranks, in the same run: seconds (median and spread) and CPU.

Layouts: for the table shapes of issue 19 (a digits split, small appends, one row group, daily
appends with a backfill), the rows one epoch trains as a fraction of the table under the old
rule (every rank runs the smallest row-group shard's full batches) and under row-exact shards.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time

import numpy as np

# name: (rows of each row group, ranks, per-rank batch)
LAYOUTS = {
    "digits train split, 10 groups": ([128] * 9 + [105], 1, 256),
    "23 small appends, 96 groups": (None, 2, 128),
    "23 small appends, 96 groups, 4 ranks": (None, 4, 64),
    "one row group of 500k": ([500_000], 2, 256),
    "30 daily appends + 2M backfill, 46 groups": (None, 8, 32),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``keras-dl bench plan``."""
    parser.add_argument("--files", type=int, default=10_000, help="add actions in the log")
    parser.add_argument("--ranks", type=int, default=512, help="ranks that plan their shard")
    parser.add_argument("--repeats", type=int, default=3, help="log replays timed")
    parser.add_argument("--out", default=None, help="also write the JSON report to this file")


def run(args) -> int:
    """Time the planning, tabulate the layouts, print JSON."""
    report = {
        "benchmark": "plan",
        "load_average": round(os.getloadavg()[0], 2),
        "planning": measure_planning(args.files, args.ranks, args.repeats),
        "resume": measure_resume(args.files, args.ranks, args.repeats),
        "manifest": measure_manifest(args.files),
        "layouts": [layout_row(name, *spec) for name, spec in LAYOUTS.items()],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if report["planning"]["target_met"] else 1


def measure_planning(files: int, ranks: int, repeats: int = 3) -> dict:
    """Replay a log of ``files`` files and plan every rank's shard; no data file exists."""
    from keras_dl.data import open_table
    from keras_dl.data.hooks import count_rows, plan_epoch

    with tempfile.TemporaryDirectory(prefix="keras-dl-bench-plan-") as tmp:
        records = write_synthetic_log(tmp, files)
        replays, cpu0 = [], time.process_time()
        for _ in range(repeats):
            start = time.perf_counter()
            snapshot = open_table(tmp)
            stats = count_rows(snapshot, ["x", "label"])
            replays.append(time.perf_counter() - start)
        replay_cpu = (time.process_time() - cpu0) / repeats
        assert stats.rows == sum(records) and stats.row_groups is None  # no footer opened
        plans, sizes = [], []
        for rank in range(ranks):
            start = time.perf_counter()
            plan = plan_epoch(stats.file_rows, rank, ranks, shuffle=True, seed=7)
            plans.append(time.perf_counter() - start)
            sizes.append(plan.rows)
            covered = sum(hi - lo for _, runs in plan.files for lo, hi in runs)
            assert covered == plan.rows
    replay = statistics.median(replays)
    per_rank = replay + max(plans)
    return {
        "files": files,
        "rows": int(sum(records)),
        "ranks": ranks,
        "log_replay_seconds_median": round(replay, 3),
        "log_replay_seconds_spread": [round(min(replays), 3), round(max(replays), 3)],
        "log_replay_cpu_seconds": round(replay_cpu, 3),
        "plan_seconds_per_rank_median": round(statistics.median(plans), 5),
        "plan_seconds_per_rank_max": round(max(plans), 5),
        "seconds_per_rank": round(per_rank, 3),
        "target": "<= 2 s per rank, no data file read (the log's files do not exist)",
        "target_met": per_rank <= 2.0,
        "rows_sum_over_ranks": int(sum(sizes)),
        "rows_per_rank_min_max": [min(sizes), max(sizes)],
        "footers_opened": 0,
    }


def measure_manifest(files: int) -> dict:
    """The training manifest of a run on the whole log (keras_dl.lineage): its bytes as logged,
    built from the log alone (no data file exists)."""
    from keras_dl.data import open_table
    from keras_dl.lineage.record import Manifest, manifest_size, split_manifest

    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        records = write_synthetic_log(tmp, files)
        start = time.perf_counter()
        m, _ = split_manifest("train", open_table(tmp))
        built = time.perf_counter() - start
        size = manifest_size(Manifest({"train": m}))
    return {
        "files": files,
        "rows": sum(records),
        "manifest_bytes": size,
        "bytes_per_file": round(size / max(files, 1), 1),
        "build_s": round(built, 3),
    }


def measure_resume(files: int, ranks: int, repeats: int = 3, batch: int = 256) -> dict:
    """Plan a resume on ``3/4 * ranks`` ranks of an epoch stopped halfway on ``ranks``."""
    from keras_dl.data.hooks import (
        EpochPosition,
        EpochRows,
        Layout,
        Segment,
        count_row_ids,
        row_ids_to_bytes,
    )

    with tempfile.TemporaryDirectory(prefix="keras-dl-bench-plan-") as tmp:
        file_rows = [10 * n for n in write_synthetic_log(tmp, files)]
    group = 125_000

    def groups(f: int) -> tuple[int, ...]:
        whole, last = divmod(file_rows[f], group)
        return (group,) * whole + ((last,) if last else ())

    after = max(1, ranks * 3 // 4)
    stopped = EpochRows(file_rows, groups, shuffle=True, seed=7, buffer=4096)
    steps = stopped.steps(Layout(ranks), batch) // 2
    position = EpochPosition(3, (Segment(ranks, batch, steps),))
    record = json.dumps(position.to_json()).encode()
    timed, fresh = [], []
    for _ in range(repeats):  # interleaved: a resume's planning, then a fresh epoch's
        rows_of = EpochRows(file_rows, groups, shuffle=True, seed=7, buffer=4096)
        wall, cpu = time.perf_counter(), time.process_time()
        resume = rows_of.resume(position, after, batch)
        pieces = rows_of.pieces(3, resume.layout, 0)
        timed.append((time.perf_counter() - wall, time.process_time() - cpu))
        rows_of = EpochRows(file_rows, groups, shuffle=True, seed=7, buffer=4096)
        wall, cpu = time.perf_counter(), time.process_time()
        rows_of.pieces(4, Layout(after), 0)
        fresh.append((time.perf_counter() - wall, time.process_time() - cpu))
    left = count_row_ids(resume.layout.rest)
    assert left + resume.trained_before == sum(file_rows) and pieces
    median = statistics.median(t for t, _ in timed)
    base = statistics.median(t for t, _ in fresh)
    return {
        "rows": int(sum(file_rows)),
        "files": files,
        "row_groups": sum(len(groups(f)) for f in range(files)),
        "stopped_on_ranks": ranks,
        "resumed_on_ranks": after,
        "batch_per_rank": batch,
        "steps_done_of_epoch": [steps, stopped.steps(Layout(ranks), batch)],
        "rows_trained_before": int(resume.trained_before),
        "data_position_bytes": len(record),
        "rest_as_runs": int(len(resume.layout.rest)),
        "rest_runs_bytes_in_memory": row_ids_to_bytes(resume.layout.rest),
        "resume_plan_seconds_median": round(median, 3),
        "resume_plan_seconds_spread": [
            round(min(t for t, _ in timed), 3),
            round(max(t for t, _ in timed), 3),
        ],
        "resume_plan_cpu_seconds_median": round(statistics.median(c for _, c in timed), 3),
        "fresh_plan_seconds_median": round(base, 4),
        "resume_over_fresh_plan": round(median / base, 1) if base else None,
    }


def layout_row(name: str, groups, ranks: int, batch: int) -> dict:
    """Rows one epoch trains, as a fraction of the table: the old rule and row-exact shards."""
    from keras_dl.data.hooks import plan_epoch, plan_pieces, shard_sizes

    groups = list(groups or _generated(name))
    total = sum(groups)
    per_shard = [sum(groups[s::ranks]) for s in range(ranks)]
    old_steps = min(per_shard) // batch if len(groups) >= ranks else 0
    old = old_steps * batch * ranks / total
    # Row-exact: one file per row group here; every rank's pieces, planned without reading.
    sizes, pieces = [], 0
    for rank in range(ranks):
        plan = plan_epoch(groups, rank, ranks, shuffle=True, seed=1)
        cut = plan_pieces(plan, lambda f: (groups[f],))
        sizes.append(sum(p.rows for p in cut))
        pieces += len(cut)
    steps = math.ceil(max(shard_sizes(total, ranks)) / batch)
    return {
        "layout": name,
        "rows": total,
        "row_groups": len(groups),
        "ranks": ranks,
        "batch_per_rank": batch,
        "old_rule_fraction_trained": "refused" if old_steps == 0 else round(old, 3),
        "row_exact_fraction_trained": round(sum(sizes) / total, 6),
        "steps": steps,
        "padded_rows_per_epoch": steps * batch * ranks - total if ranks > 1 else 0,
        "row_groups_read_per_epoch": pieces,
    }


def write_synthetic_log(root: str, files: int, seed: int = 0) -> list[int]:
    """Version 0 of a Delta table of ``files`` add actions with ``numRecords``; no data files."""
    rng = np.random.default_rng(seed)
    records = rng.integers(50_000, 150_000, size=files).tolist()
    actions = log_head("bench-plan", [("x", "float"), ("label", "long")])
    for i, n in enumerate(records):
        actions.append(
            {
                "add": {
                    "path": f"part-{i:05d}-missing.parquet",
                    "partitionValues": {},
                    "size": 8 * n,
                    "modificationTime": 0,
                    "dataChange": True,
                    "stats": json.dumps({"numRecords": n}),
                }
            }
        )
    log = os.path.join(root, "_delta_log")
    os.makedirs(log)
    with open(os.path.join(log, f"{0:020d}.json"), "w") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")
    return records


def _generated(name: str) -> list[int]:
    """Row groups of the generated layouts, as issue 19 measured them."""
    rng = np.random.default_rng(0)
    if name.startswith("23 small appends"):
        # 23 appends of about 42 rows, each cut into row groups of up to 11 rows: 96 groups.
        sizes = []
        rows = np.full(23, 42)
        rows[: 966 - 42 * 23] += 1
        for n in rows:
            cuts = [11, 11, 11, int(n) - 33] if n > 33 else [int(n)]
            sizes.extend(c for c in cuts if c)
        while len(sizes) < 96:
            biggest = int(np.argmax(sizes))
            half = sizes[biggest] // 2
            sizes[biggest : biggest + 1] = [half, sizes[biggest] - half]
        return sizes
    # 30 daily appends of 50k-150k rows (one row group each), a 2M-row backfill in 16 groups.
    daily = rng.integers(50_000, 150_000, size=30).tolist()
    return daily + [125_000] * 16


def log_head(table_id: str, fields: list[tuple[str, str]]) -> list[dict]:
    """The protocol and metaData actions of version 0 of an unpartitioned Delta table whose
    columns are ``(name, Delta type)`` pairs (the benchmarks write their logs with it)."""
    schema = {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
    }
    return [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": table_id,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 0,
            }
        },
    ]
