"""``keras-dl bench input --store s3|azure --latency-ms D``: streaming from an object store at latency.

Starts an emulator on loopback, moto's S3 (``--store s3``) or Azurite's Blob service
(``--store azure``, the tables at ``abfss://``), behind a latency proxy that holds every
client-to-server chunk for D ms (:mod:`benchmarks.remote_store`, :mod:`benchmarks.latency_proxy`).
It writes the tables ``--tables`` names (default both) to the store and to local disk:

- ``floats40``: 240,000 rows of 40 float32 columns and an int64 label, 12 files
  of 4 row groups (``--quick``: 24,000 rows in 4 files of 2);
- ``wide``: the wide table of ``keras-dl bench input``, 100,000 rows of 200 float32 columns and a
  label, one file of row groups of 8,192 rows (``--quick``: 1,024 rows in groups of 256).

It measures, for each table, at 0 and at D ms, in interleaved rounds (both tables in each round):

- ``keras_dl``: one training stream at batch 256, ``data.cache=never`` (every epoch read from
  the store), rows/s consumed inside a ``tf.function``, and CPU per row;
- ``keras_dl_io_off``: the same with ``data.io_concurrency=0`` (no fetching ahead: each worker
  opens the file and reads its row group itself, two round trips a row group: the reader before);
- ``pyarrow_scan``: a parallel ``pyarrow.dataset`` scan of the same files through the same
  proxy (``S3FileSystem`` or ``AzureFileSystem``; pre-buffered, with its default read-ahead),
  the limit;
- ``keras_dl_disk_cache``: epoch 2 and later with ``data.cache_dir``: the same stream over the
  host's local copy of the store's files (filled once before the rounds, as during the first
  epoch), the store still D ms away;
- ``keras_dl_local_disk``: its baseline, the same stream over the same table written to local
  disk and read in place.

Then the bytes each path fetched for one cold epoch (counted at the proxy: footers, listing and
HTTP headers included) over the bytes the plan needs (the planned column chunks), what an epoch
from the local cache still fetched from the store, and the
ratios, with the issue's targets for each table. Figures are medians of the rounds with [min,
max] spreads; ratios are of the medians, their spreads of the per-round ratios
(:mod:`benchmarks.timing`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

from benchmarks import input_tables, timing
from benchmarks.input_remote_paths import BATCH, bytes_fetched, keras_dl, scan
from benchmarks.remote_store import azure_behind_proxy, s3_behind_proxy

SIZES = {
    "full": {
        "floats40": {"rows": 240_000, "columns": 40, "files": 12, "groups_per_file": 4},
        "wide": {"rows": 100_000, "columns": input_tables.WIDE_COLUMNS, "rows_per_group": 8_192},
    },
    "quick": {
        "floats40": {"rows": 24_000, "columns": 40, "files": 4, "groups_per_file": 2},
        "wide": {"rows": 1_024, "columns": input_tables.WIDE_COLUMNS, "rows_per_group": 256},
    },
}
TABLES = tuple(SIZES["full"])
STORES = {
    "s3": ("s3 (moto's server on 127.0.0.1, behind a loopback latency proxy)", s3_behind_proxy),
    "azure": (
        "azure (Azurite's Blob service on 127.0.0.1, behind a loopback latency proxy)",
        azure_behind_proxy,
    ),
}
PATHS = ("keras_dl", "keras_dl_io_off", "pyarrow_scan")
LOCAL_PATHS = ("keras_dl_disk_cache", "keras_dl_local_disk")  # no store, no latency: no "@"
TARGETS = {  # at D ms
    ("keras_dl@D", "keras_dl@0"): 0.8,
    ("keras_dl@D", "pyarrow_scan@D"): 1.0,
    ("keras_dl_disk_cache", "keras_dl_local_disk"): 0.9,
}
RATIOS = (
    *TARGETS,
    ("keras_dl@D", "keras_dl_io_off@D"),  # what fetching ahead buys at latency
    ("keras_dl@0", "keras_dl_io_off@0"),  # and costs without it
    ("keras_dl_io_off@D", "keras_dl_io_off@0"),
    ("pyarrow_scan@D", "pyarrow_scan@0"),
)
BYTES_TARGET = 1.1  # fetched / planned, at most


def add_arguments(p) -> None:
    """The remote store's arguments of ``keras-dl bench input``."""
    p.add_argument(
        "--store",
        choices=("local", *STORES),
        default="local",
        help="local: the tables on disk (default); s3, azure: the floats40 table and the wide "
        "table on moto's S3 or on Azurite behind a loopback latency proxy, streamed at 0 and "
        "--latency-ms (with --tables: floats40, wide, or both, the default)",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=40.0,
        help="with --store s3|azure: how long the proxy holds each request chunk (default: 40)",
    )


def run(args) -> int:
    """Measure, print the JSON report (the targets also to stderr as a table)."""
    quick = args.quick
    tables = _tables(args.tables)
    sizes = {t: SIZES["quick" if quick else "full"][t] for t in tables}
    if quick:
        rounds = args.rounds or 1
        timing.MIN_SECONDS = 0.2  # a smoke test: the figures are not meant to be read
    else:
        rounds = max(args.rounds or timing.MIN_ROUNDS, timing.MIN_ROUNDS)
    delay = float(args.latency_ms)
    store_said, behind_proxy = STORES[args.store]
    report: dict = {
        "config": {
            "store": store_said,
            "mode": "quick" if quick else "full",
            "tables": sizes,
            "batch": BATCH,
            "latency_ms": [0.0, delay],
            "rounds": rounds,
            "min_seconds_per_figure": timing.MIN_SECONDS,
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "unit": "rows/s consumed inside a tf.function; cpu: this process, all threads",
            "figures": "median of the rounds; spread: [min, max]; ratios: of the medians",
            "command": " ".join(["keras-dl", *sys.argv[1:]]) if sys.argv else "",
        }
    }
    with behind_proxy() as store, tempfile.TemporaryDirectory(prefix="keras_dl_") as local:
        uris = {}
        for name, size in sizes.items():
            uris[name] = _write_table(name, store.uri(name), size)
            _write_table(name, f"{local}/{name}", size)  # the same rows, on local disk
        report["tables"] = _measure(store, uris, local, delay, rounds)
    report["config"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report["targets"] = [t for name in tables for t in _targets(report, name)]
    text = json.dumps(report, indent=2)
    print(timing.format_targets(report["targets"]), file=sys.stderr)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def _tables(said: str | None) -> tuple[str, ...]:
    """The tables ``--tables`` names (default: all of :data:`TABLES`)."""
    names = tuple(t.strip() for t in (said or ",".join(TABLES)).split(",") if t.strip())
    unknown = sorted(set(names) - set(TABLES))
    if unknown or not names:
        raise SystemExit(
            f"--tables {said!r}: with --store s3|azure the tables are {', '.join(TABLES)} "
            f"(comma-separated), not {', '.join(unknown) or 'none'}."
        )
    return names


def _write_table(name: str, uri: str, size: dict) -> str:
    if name == "wide":
        return input_tables.write_wide(uri, size["rows"], size["rows_per_group"], label=True)
    return input_tables.write_floats40(uri, **size)


def _measure(store, uris: dict[str, str], local: str, delay: float, rounds: int) -> dict:
    """Every table's paths, interleaved in the same rounds; per table its figures and bytes."""
    from keras_dl.data import open_table, plan_columns
    from keras_dl.data.tables.disk_copy import cache_files

    proxy = store.proxy
    delays = (0.0, delay)

    def at(ms: float, fn):
        def measure():
            proxy.delay_ms = ms
            return fn()

        return measure

    paths, opened = {}, {}
    for table, uri in uris.items():
        snapshot = open_table(uri)
        plan = plan_columns(snapshot, (), "label")
        proxy.delay_ms = delay
        cached = cache_files(snapshot, f"{local}/cache_{table}")  # filled as epoch 1 runs, at D
        cached.local_copies.wait()
        cached = cached.with_local_copies()  # what epoch 2 reads
        proxy.delay_ms = 0.0
        on_disk = open_table(f"{local}/{table}")
        opened[table] = snapshot, plan, cached
        for ms in delays:
            paths[f"{table}:keras_dl@{ms:g}ms"] = at(ms, lambda s=snapshot, p=plan: keras_dl(s, p))
            paths[f"{table}:keras_dl_io_off@{ms:g}ms"] = at(
                ms, lambda s=snapshot, p=plan: keras_dl(s, p, io=0)
            )
            paths[f"{table}:pyarrow_scan@{ms:g}ms"] = at(ms, lambda s=snapshot: scan(s))
        # Read from local disk while the store is still D ms away.
        paths[f"{table}:keras_dl_disk_cache"] = at(delay, lambda c=cached, p=plan: keras_dl(c, p))
        paths[f"{table}:keras_dl_local_disk"] = at(delay, lambda d=on_disk, p=plan: keras_dl(d, p))
    cpu: dict = {}
    every = timing.measure_rounds(rounds, paths, cpu)
    out = {}
    for table, (snapshot, plan, cached) in opened.items():
        mine = f"{table}:"
        samples = {k[len(mine) :]: v for k, v in every.items() if k.startswith(mine)}
        table_cpu = {k[len(mine) :]: v for k, v in cpu.items() if k.startswith(mine)}
        # Decoded bytes a row (fixed-width columns), for the MB/s figures.
        row_bytes = sum(snapshot.schema.field(c).type.bit_width // 8 for c in plan.columns)
        out[table] = _summary(samples, table_cpu, row_bytes, delay)
        proxy.delay_ms = delay
        out[table]["bytes"] = bytes_fetched(proxy, snapshot, plan, cached)
        proxy.delay_ms = 0.0
    return out


def _summary(samples: dict, cpu: dict, row_bytes: int, delay: float) -> dict:
    out = timing.summarize(samples, subjects=(), scale=row_bytes, cpu=cpu)
    out["ratios"], out["ratio_spread"] = {}, {}
    for a, b in RATIOS:
        key = _ratio_name(a, b, delay)
        mine, theirs = samples[_name(a, delay)], samples[_name(b, delay)]
        out["ratios"][key] = timing.ratio(statistics.median(mine), statistics.median(theirs))
        out["ratio_spread"][key] = timing.ratio_spread(mine, theirs)
    return out


def _name(symbolic: str, delay: float) -> str:
    """``keras_dl@D`` as the path is named at ``delay`` ms: ``keras_dl@40ms``."""
    if "@" not in symbolic:
        return symbolic  # a local path
    path, at = symbolic.split("@")
    return f"{path}@{(delay if at == 'D' else 0.0):g}ms"


def _ratio_name(a: str, b: str, delay: float) -> str:
    return f"{_name(a, delay)}/{_name(b, delay)}"


def _targets(report: dict, table: str) -> list[dict]:
    delay = report["config"]["latency_ms"][1]
    figures = report["tables"][table]
    out = []
    for (a, b), minimum in TARGETS.items():
        key = _ratio_name(a, b, delay)
        value, met = timing.judged(figures["ratios"][key], minimum)
        cpu = figures["cpu_us_per_unit"]
        mine, theirs = cpu[_name(a, delay)], cpu[_name(b, delay)]
        out.append(
            {
                "table": table,
                "ratio": key,
                "value": value,
                "spread": figures["ratio_spread"][key],
                "target": minimum,
                "met": met,
                # The same pair's CPU per row (all threads): lower is cheaper.
                "cpu_ratio": round(mine / theirs, 2) if theirs else None,
            }
        )
    ratio = figures["bytes"]["keras_dl"]["fetched/planned"]
    out.append(
        {
            "table": table,
            "ratio": "keras_dl bytes fetched/planned",
            "value": ratio,
            "target": f"<= {BYTES_TARGET}",
            "met": ratio <= BYTES_TARGET,
        }
    )
    return out
