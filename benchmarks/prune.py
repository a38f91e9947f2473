"""Data skipping: what a selective filter reads with and without file and row-group skipping.

A Delta table of ``--files`` files (``--groups`` row groups each, rows sorted by ``day``, one
day per row group, each file's ``stats`` written by :func:`keras_dl.data.ingest.spark_delta.file_stats`)
is read through the filter ``day >= D`` (the last ``--keep`` row groups of the table) the way
a training split is: select, count (the scan), then one epoch of every column. The baseline is
the same read with ``data_skipping=False`` (every file opened, every row group's filter column
read to count), from the same run, interleaved after one warm-up read each, median of ``--repeats``.

Printed (JSON): files opened and row groups read (from the plan), bytes read (the process's
``rchar``: every byte its read calls returned, cached or not), wall and CPU time, CPU per
kept row; each beside its baseline as a ratio, and whether both reads returned the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``keras-dl bench prune``."""
    parser.add_argument("--files", type=int, default=100, help="data files in the table")
    parser.add_argument("--groups", type=int, default=4, help="row groups per file")
    parser.add_argument("--rows", type=int, default=2_000, help="rows per row group")
    parser.add_argument("--features", type=int, default=16, help="float32 feature columns")
    parser.add_argument("--keep", type=int, default=10, help="row groups the filter keeps")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved reads per mode")
    parser.add_argument("--out", default=None, help="also write the JSON report to this file")


def run(args) -> int:
    """Write the table, read it both ways, print JSON; 1 if the two reads differ."""
    with tempfile.TemporaryDirectory(prefix="keras-dl-bench-prune-") as root:
        first = write_table(root, args.files, args.groups, args.rows, args.features)
        day = args.files * args.groups - args.keep
        measured: dict[bool, list[dict]] = {True: [], False: []}
        for skipping in (False, True):  # warm-up: imports, the page cache, Petastorm's pool
            read_once(root, f"day >= {day}", skipping)
        for _ in range(args.repeats):
            for skipping in (False, True):
                measured[skipping].append(read_once(root, f"day >= {day}", skipping))
    report = summarize(measured, args, first)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if report["same_rows"] else 1


def write_table(root: str, files: int, groups: int, rows: int, features: int) -> int:
    """Version 0 of a Delta table: file ``i`` holds days ``i*groups`` to ``i*groups+groups-1``,
    a row group per day; every ``add`` carries its column statistics. Returns its bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.plan import log_head
    from keras_dl.data.hooks import file_stats

    rng = np.random.default_rng(0)
    fields = [("id", "long"), ("day", "integer"), ("label", "long")]
    fields += [(f"f{j}", "float") for j in range(features)]
    actions = log_head("bench-prune", fields)
    size = 0
    per_file = groups * rows
    for i in range(files):
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        columns = {
            "id": ids,
            "day": (ids // rows).astype(np.int32),
            "label": rng.integers(0, 10, per_file),
            **{f"f{j}": rng.random(per_file, dtype=np.float32) for j in range(features)},
        }
        name = f"part-{i:05d}.parquet"
        pq.write_table(pa.table(columns), os.path.join(root, name), row_group_size=rows)
        meta = pq.read_metadata(os.path.join(root, name))
        size += os.path.getsize(os.path.join(root, name))
        add = {
            "path": name,
            "partitionValues": {},
            "size": os.path.getsize(os.path.join(root, name)),
            "modificationTime": 0,
            "dataChange": True,
            "stats": file_stats(meta),
        }
        actions.append({"add": add})
    os.makedirs(os.path.join(root, "_delta_log"))
    with open(os.path.join(root, "_delta_log", f"{0:020d}.json"), "w") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")
    return size


def read_once(root: str, text: str, skipping: bool) -> dict:
    """One filtered read as a training split reads it: select, count, one epoch of all columns."""
    from keras_dl.data import open_table, select
    from keras_dl.data.hooks import epoch_pieces, parse_filters, read_pieces, scan_table

    rchar, wall, cpu = _rchar(), time.perf_counter(), time.process_time()
    snapshot = replace(open_table(root), data_skipping=skipping)
    snapshot = select(snapshot, parse_filters([text], snapshot.schema))
    stats = scan_table(snapshot)
    pieces = epoch_pieces(snapshot, stats)
    ids = 0
    for _, table in read_pieces(snapshot, snapshot.schema.names, pieces, workers=2):
        ids += int(np.asarray(table.column("id")).sum())
    groups = sum(len(g) for g in stats.group_rows or ())
    return {
        "files_opened": len(snapshot.files),
        "files_skipped": snapshot.skipped_files,
        # The count reads the filter column of every row group it does not skip; the epoch
        # reads every column of the row groups that hold kept rows.
        "row_groups_scanned": groups - stats.row_groups_skipped,
        "row_groups_read": len(pieces),
        "rows_scanned": stats.rows_scanned,
        "rows_kept": stats.rows,
        "bytes_read": _rchar() - rchar,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "id_sum": ids,
    }


def summarize(measured: dict[bool, list[dict]], args, table_bytes: int) -> dict:
    """Medians per mode, and each skipping figure beside its baseline as a ratio."""

    def median(mode: bool, key: str) -> float:
        return statistics.median(m[key] for m in measured[mode])

    keys = ["files_opened", "row_groups_scanned", "row_groups_read", "rows_scanned", "bytes_read"]
    keys += ["wall_s", "cpu_s"]
    figures = {}
    for key in keys:
        with_, without = median(True, key), median(False, key)
        figures[key] = {
            "skipping": _round(with_),
            "baseline": _round(without),
            "ratio": round(with_ / without, 4) if without else None,
        }
    kept = measured[True][0]["rows_kept"]
    cpu_row = {m: median(m, "cpu_s") / max(kept, 1) * 1e6 for m in (True, False)}
    figures["cpu_us_per_kept_row"] = {
        "skipping": round(cpu_row[True], 2),
        "baseline": round(cpu_row[False], 2),
        "ratio": round(cpu_row[True] / cpu_row[False], 4),
    }
    results = {(m["rows_kept"], m["id_sum"]) for mode in measured.values() for m in mode}
    return {
        "benchmark": "prune",
        "table": {
            "files": args.files,
            "row_groups": args.files * args.groups,
            "rows": args.files * args.groups * args.rows,
            "columns": 3 + args.features,
            "bytes": table_bytes,
            "filter": f"day >= {args.files * args.groups - args.keep}",
        },
        "rows_kept": kept,
        "files_skipped": measured[True][0]["files_skipped"],
        "figures": figures,
        "method": "median of interleaved repeats; ratio: skipping / baseline (no skipping)",
        "repeats": args.repeats,
        "load_average": round(os.getloadavg()[0], 2),
        "same_rows": len(results) == 1,
    }


def _rchar() -> int:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration):
        return 0  # not Linux: bytes are not measured


def _round(value: float) -> float:
    return round(value, 4) if isinstance(value, float) else value
