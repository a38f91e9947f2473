"""``keras-dl predict``: score a table with a registered model and write a Delta table.

Imported to build the command line parser, so Spark, MLflow and TensorFlow are imported inside
the functions.
"""

from __future__ import annotations

import argparse

from keras_dl.inference.driver import predict


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl predict`` arguments."""
    p.add_argument("--model", required=True, help="models:/NAME/VERSION or models:/NAME@ALIAS")
    p.add_argument("--table", required=True, help="Delta table or Parquet path to score")
    p.add_argument("--version", type=int, default=None, help="Delta version of --table")
    p.add_argument("--out", required=True, help="Delta table to write the predictions to")
    p.add_argument("--mode", default="error", choices=["error", "append", "overwrite"])
    p.add_argument("--key", action="append", default=None, help="key column (repeatable)")
    p.add_argument("--features", default=None, help="input column of a single-tensor model")
    p.add_argument(
        "--batch-size", type=_positive_int, default=1024, help="rows per Arrow batch (>= 1)"
    )
    p.add_argument(
        "--master",
        default="local[*]",
        help="Spark master, or a Spark Connect URL sc://HOST:PORT (default: local[*])",
    )
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI")


def run(args: argparse.Namespace) -> int:
    """``keras-dl predict``: read the table into Spark, score it, write a Delta table."""
    from keras_dl.data.ingest.spark_delta import check_writable
    from keras_dl.inference.tables import read_table_into_spark, spark_session, write_predictions

    check_writable(args.out, args.mode)  # before Spark starts and anything is scored
    spark = spark_session(args.master)
    try:
        df, snapshot = read_table_into_spark(spark, args.table, args.version)
        scored = predict(
            df,
            args.model,
            features=[args.features] if args.features else None,
            keys=args.key,
            batch_size=args.batch_size,
            tracking_uri=args.tracking_uri,
        )
        report = write_predictions(scored, args.out, mode=args.mode)
    finally:
        spark.stop()
    print(
        f"scored {report.rows} rows of {snapshot.uri} (version {snapshot.version}) with "
        f"{args.model}: wrote {report.files} file(s) to Delta table {args.out} version "
        f"{report.version}"
    )
    return 0


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value
