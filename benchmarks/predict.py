"""Batch scoring: the driver's peak memory as the scored table grows.

``keras-dl predict`` lets Spark tasks read, score and write the rows; the driver only plans the
job and commits one Delta transaction with the files' add actions. So the driver's peak RSS
should not grow with the table. This benchmark scores a table of ``--rows`` rows (the baseline)
and one of ``--scale`` times as many, each in a fresh driver process, with the same registered
model on a local Spark, and prints the driver's peak RSS (``VmHWM`` of the Python driver) for
both, their ratio (target <= 1.2) and the rows/s. The JVM (which in local mode also runs the
executors) is not the driver's Python memory and is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FEATURES = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``keras-dl bench predict``."""
    parser.add_argument("--rows", type=int, default=50_000, help="rows of the 1x table")
    parser.add_argument("--scale", type=int, default=8, help="the large table is this times 1x")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--out", default=None, help="also write the JSON report to this file")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)  # internal: table out uri


def run(args) -> int:
    """Build the tables and the model, score each size in a fresh process, print JSON."""
    if args.worker:
        print("RESULT " + json.dumps(_score(*args.worker, args.master)), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="keras-dl-bench-predict-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        _register_model(uri)
        sizes = {"1x": args.rows, f"{args.scale}x": args.rows * args.scale}
        results = {}
        for name, rows in sizes.items():
            table = os.path.join(tmp, f"table-{name}")
            _write_table(table, rows)
            results[name] = _in_subprocess(table, os.path.join(tmp, f"scores-{name}"), uri, args)
    base, big = results["1x"], results[f"{args.scale}x"]
    report = {
        "benchmark": "predict",
        "master": args.master,
        "load_average": round(os.getloadavg()[0], 2),
        "runs": results,
        "driver_peak_rss_ratio": round(big["driver_peak_rss_mb"] / base["driver_peak_rss_mb"], 3),
        "target": "driver peak RSS at the large table <= 1.2 x at 1x",
    }
    report["target_met"] = report["driver_peak_rss_ratio"] <= 1.2
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def _score(table: str, out: str, uri: str, master: str) -> dict:
    """One ``keras-dl predict`` run in this process: rows, seconds and the driver's peak RSS."""
    from keras_dl.inference import add_arguments as predict_arguments
    from keras_dl.inference import run as predict

    parser = argparse.ArgumentParser()
    predict_arguments(parser)
    argv = ["--model", "models:/bench_predict/1", "--table", table, "--out", out, "--features", "x"]
    args = parser.parse_args([*argv, "--master", master, "--tracking-uri", uri])
    start = time.perf_counter()
    predict(args)
    seconds = time.perf_counter() - start
    from keras_dl.data import read_table

    rows = read_table(out, columns=["prediction"]).num_rows
    return {
        "rows": rows,
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "driver_peak_rss_mb": _peak_rss_mb(),
    }


def _in_subprocess(table: str, out: str, uri: str, args) -> dict:
    cmd = [sys.executable, "-m", "keras_dl.cli", "bench", "predict", "--master", args.master]
    proc = subprocess.run(
        [*cmd, "--worker", table, out, uri], capture_output=True, text=True, timeout=3600
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"the predict measurement failed:\n{proc.stderr[-3000:]}")


def _write_table(path: str, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    from keras_dl.storage import delta_row_group_options

    rng = np.random.default_rng(0)
    chunk = 100_000

    def batches():
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            values = pa.array(rng.normal(size=n * FEATURES))
            offsets = pa.array(np.arange(0, (n + 1) * FEATURES, FEATURES, dtype=np.int32))
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.arange(start, start + n)), pa.ListArray.from_arrays(offsets, values)],
                schema=schema,
            )

    schema = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float64()))])
    write_deltalake(
        path,
        pa.RecordBatchReader.from_batches(schema, batches()),
        **delta_row_group_options(16_384),
        # Files of about 131k rows (delta-rs cuts files by bytes): several Spark tasks score them.
        target_file_size=131_072 * 8 * (FEATURES + 1),
    )


def _register_model(uri: str) -> None:
    import keras
    import mlflow
    import numpy as np
    from mlflow.models import infer_signature

    mlflow.set_tracking_uri(uri)
    inputs = keras.Input(shape=(FEATURES,), name="x")
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    sample = np.zeros((4, FEATURES), dtype=np.float64)
    with mlflow.start_run():
        mlflow.keras.log_model(
            model,
            name="model",
            signature=infer_signature(sample, model.predict(sample, verbose=0)),
            registered_model_name="bench_predict",
        )


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0
