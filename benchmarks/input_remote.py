"""``keras-dl bench input --store s3 --latency-ms D``: streaming from an object store at latency.

Starts moto's S3 server on loopback behind a latency proxy that holds every client-to-server
chunk for D ms (:mod:`benchmarks.remote_store`, :mod:`benchmarks.latency_proxy`), writes issue
34's table to the bucket (240,000 rows of 40 float32 columns and an int64 label, 12 files of 4
row groups; ``--quick``: 24,000 rows in 4 files of 2), and measures, at 0 and at D ms, in
interleaved rounds:

- ``keras_dl``: one training stream at batch 256, ``data.cache=never`` (every epoch read from
  the store), rows/s consumed inside a ``tf.function``, and CPU per row;
- ``keras_dl_io_off``: the same with ``data.io_concurrency=0`` (no fetching ahead: each worker
  opens the file and reads its row group itself, two round trips a row group: the reader before);
- ``pyarrow_scan``: a parallel ``pyarrow.dataset`` scan of the same files through the same
  proxy (pre-buffered, with its default read-ahead), the limit;
- ``keras_dl_disk_cache``: epoch 2 and later with ``data.cache_dir``: the same stream over the
  host's local copy of the S3 files (filled once before the rounds, as during the first epoch);
- ``keras_dl_local_disk``: its baseline, the same stream over the same table written to local
  disk and read in place.

Then the bytes each path fetched for one cold epoch (counted at the proxy: footers, listing and
HTTP headers included) over the bytes the plan needs (the planned column chunks), and the
ratios, with the issue's targets. Figures are medians of the rounds with [min, max] spreads;
ratios are of the medians, their spreads of the per-round ratios (:mod:`benchmarks.timing`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import numpy as np
import pyarrow as pa

from benchmarks import timing
from benchmarks.input_paths import consume_split
from benchmarks.remote_store import s3_behind_proxy

SIZES = {
    "full": {"rows": 240_000, "columns": 40, "files": 12, "groups_per_file": 4},
    "quick": {"rows": 24_000, "columns": 40, "files": 4, "groups_per_file": 2},
}
BATCH = 256
PATHS = ("keras_dl", "keras_dl_io_off", "pyarrow_scan")
LOCAL_PATHS = ("keras_dl_disk_cache", "keras_dl_local_disk")  # no store, no latency: no "@"
TARGETS = {  # issue 34, at D ms
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
        choices=("local", "s3"),
        default="local",
        help="local: the tables on disk (default); s3: issue 34's table on moto's S3 behind a "
        "loopback latency proxy, streamed at 0 and --latency-ms",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=40.0,
        help="with --store s3: how long the proxy holds each request chunk (default: 40)",
    )


def run(args) -> int:
    """Measure, print the JSON report (the targets also to stderr as a table)."""
    quick = args.quick
    size = SIZES["quick" if quick else "full"]
    if quick:
        rounds = args.rounds or 1
        timing.MIN_SECONDS = 0.2  # a smoke test: the figures are not meant to be read
    else:
        rounds = max(args.rounds or timing.MIN_ROUNDS, timing.MIN_ROUNDS)
    delay = float(args.latency_ms)
    report: dict = {
        "config": {
            "store": "s3 (moto's server on 127.0.0.1, behind a loopback latency proxy)",
            "mode": "quick" if quick else "full",
            **size,
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
    with s3_behind_proxy() as store, tempfile.TemporaryDirectory(prefix="keras_dl_") as local:
        uri = _write_table(store.uri("issue34"), size)
        _write_table(f"{local}/issue34", size)  # the same rows, on local disk
        report.update(_measure(store, uri, local, delay, rounds))
    report["config"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report["targets"] = _targets(report)
    text = json.dumps(report, indent=2)
    print(timing.format_targets(report["targets"]), file=sys.stderr)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def _write_table(uri: str, size: dict) -> str:
    """Issue 34's table at ``uri``: one Delta commit per file, so it has ``files`` files."""
    from keras_dl.data.ingest import write_table

    rng = np.random.default_rng(0)
    per_file = size["rows"] // size["files"]
    for k in range(size["files"]):
        columns = {
            f"f{j:02d}": rng.random(per_file, dtype=np.float32) for j in range(size["columns"])
        }
        columns["label"] = rng.integers(0, 10, per_file)
        write_table(
            pa.table(columns),
            uri,
            mode="append" if k else "overwrite",
            rows_per_group=per_file // size["groups_per_file"],
        )
    return uri


def _measure(store, uri: str, local: str, delay: float, rounds: int) -> dict:
    from keras_dl.data import open_table, plan_columns
    from keras_dl.data.tables.disk_copy import cache_files

    proxy = store.proxy
    snapshot = open_table(uri)
    plan = plan_columns(snapshot, (), "label")
    proxy.delay_ms = delay
    cached = cache_files(snapshot, f"{local}/cache")  # filled as the first epoch runs, at D ms
    cached.local_copies.wait()
    cached = cached.with_local_copies()  # what epoch 2 reads
    proxy.delay_ms = 0.0
    on_disk = open_table(f"{local}/issue34")
    delays = (0.0, delay)

    def at(ms: float, fn):
        def measure():
            proxy.delay_ms = ms
            return fn()

        return measure

    paths = {}
    for ms in delays:
        paths[f"keras_dl@{ms:g}ms"] = at(ms, lambda: _keras_dl(snapshot, plan))
        paths[f"keras_dl_io_off@{ms:g}ms"] = at(ms, lambda: _keras_dl(snapshot, plan, io=0))
        paths[f"pyarrow_scan@{ms:g}ms"] = at(ms, lambda: _scan(snapshot))
    paths["keras_dl_disk_cache"] = lambda: _keras_dl(cached, plan)
    paths["keras_dl_local_disk"] = lambda: _keras_dl(on_disk, plan)
    cpu: dict = {}
    samples = timing.measure_rounds(rounds, paths, cpu)
    # Decoded bytes a row (fixed-width columns), for the MB/s figures.
    row_bytes = sum(snapshot.schema.field(c).type.bit_width // 8 for c in plan.columns)
    out = timing.summarize(samples, subjects=(), scale=row_bytes, cpu=cpu)
    out["ratios"], out["ratio_spread"] = {}, {}
    for a, b in RATIOS:
        key = _ratio_name(a, b, delay)
        mine, theirs = samples[_name(a, delay)], samples[_name(b, delay)]
        out["ratios"][key] = round(statistics.median(mine) / statistics.median(theirs), 3)
        per_round = [x / y for x, y in zip(mine, theirs) if y > 0]
        out["ratio_spread"][key] = [round(min(per_round), 3), round(max(per_round), 3)]
    proxy.delay_ms = delay
    out["bytes"] = _bytes(proxy, snapshot, plan)
    proxy.delay_ms = 0.0
    return out


def _name(symbolic: str, delay: float) -> str:
    """``keras_dl@D`` as the path is named at ``delay`` ms: ``keras_dl@40ms``."""
    if "@" not in symbolic:
        return symbolic  # a local path
    path, at = symbolic.split("@")
    return f"{path}@{(delay if at == 'D' else 0.0):g}ms"


def _ratio_name(a: str, b: str, delay: float) -> str:
    return f"{_name(a, delay)}/{_name(b, delay)}"


def _keras_dl(snapshot, plan, io: int | None = None, training: bool = True):
    from keras_dl.data import ReadOptions, make_dataset

    extra = {} if io is None else {"io_concurrency": io}
    options = ReadOptions(BATCH, training=training, cache_max_bytes=0, **extra)
    split = make_dataset(snapshot, plan, options)
    if not training:
        return split
    return consume_split(split, BATCH)


def _scan_dataset(snapshot):
    import pyarrow.dataset as ds

    from keras_dl.storage import s3_filesystem

    fmt = ds.ParquetFileFormat(
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True)
    )
    paths = [f.split("://", 1)[1] for f in snapshot.files]
    return ds.dataset(paths, format=fmt, filesystem=s3_filesystem())


def _scan(snapshot) -> float:
    """Rows/s of a parallel pyarrow dataset scan of the table's files (every column)."""
    dataset = _scan_dataset(snapshot)
    return timing.timed_loop(lambda: sum(b.num_rows for b in dataset.to_batches()))


def _bytes(proxy, snapshot, plan) -> dict:
    """Bytes each path fetched for one cold epoch (footers and all), over the planned bytes."""
    import pyarrow.parquet as pq

    from keras_dl.data.hooks import FileChunks
    from keras_dl.storage import s3_filesystem

    fs = s3_filesystem()
    planned = 0
    for index, path in enumerate(snapshot.files):
        meta = pq.read_metadata(path.split("://", 1)[1], filesystem=fs)
        chunks = FileChunks(snapshot, index, meta, plan.columns)
        planned += sum(chunks.bytes(rg) for rg in range(meta.num_row_groups))
    out: dict = {"planned": planned}
    for name, one_epoch in (
        ("keras_dl", lambda: _epoch(_keras_dl(snapshot, plan, training=False))),
        ("keras_dl_io_off", lambda: _epoch(_keras_dl(snapshot, plan, io=0, training=False))),
        ("pyarrow_scan", lambda: sum(b.num_rows for b in _scan_dataset(snapshot).to_batches())),
    ):
        before = proxy.counts()
        rows = one_epoch()
        after = proxy.counts()
        fetched = after["received"] - before["received"]
        out[name] = {
            "rows": rows,
            "fetched": fetched,
            "requests": after["requests"] - before["requests"],
            "fetched/planned": round(fetched / planned, 3),
        }
    return out


def _epoch(split) -> int:
    """Rows of one evaluation epoch (no next epoch read ahead), iterated."""
    rows = 0
    for element in split.dataset:
        first = element[0] if isinstance(element, tuple) else element
        rows += int(next(iter(first.values())).shape[0] if isinstance(first, dict) else len(first))
    return rows


def _targets(report: dict) -> list[dict]:
    delay = report["config"]["latency_ms"][1]
    out = []
    for (a, b), minimum in TARGETS.items():
        key = _ratio_name(a, b, delay)
        value = round(report["ratios"][key], 2)  # judged as printed
        cpu = report["cpu_us_per_unit"]
        mine, theirs = cpu[_name(a, delay)], cpu[_name(b, delay)]
        out.append(
            {
                "ratio": key,
                "value": value,
                "spread": report["ratio_spread"][key],
                "target": minimum,
                "met": value >= minimum,
                # The same pair's CPU per row (all threads): lower is cheaper.
                "cpu_ratio": round(mine / theirs, 2) if theirs else None,
            }
        )
    ratio = report["bytes"]["keras_dl"]["fetched/planned"]
    out.append(
        {
            "ratio": "keras_dl bytes fetched/planned",
            "value": ratio,
            "target": f"<= {BYTES_TARGET}",
            "met": ratio <= BYTES_TARGET,
        }
    )
    return out
