"""The tables ``keras-dl bench input`` measures, generated on the spot.

- narrow: a float, an int and a 16-float list per row (Delta);
- wide: 200 float columns (Delta);
- floats40: 40 float columns and a label, one Delta commit (one file) at a time
  (``keras-dl bench input --store s3|azure``);
- images: 64x64 JPEGs plus a label, written once as a Petastorm dataset (Unischema with
  ``CompressedImageCodec``, through ``materialize_dataset`` on a local Spark) and once as a Delta
  table holding the very same JPEG bytes, so both paths decode identical data.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa

NARROW_LIST = 16
WIDE_COLUMNS = 200
IMAGE_SIZE = 64


def write_narrow(path: str, rows: int, rows_per_group: int, seed: int = 0) -> str:
    """Write ``rows`` narrow rows (streamed in chunks, so 8x the size fits in memory)."""
    from keras_dl.data.ingest import write_table

    rng = np.random.default_rng(seed)
    schema = pa.schema([("f", pa.float32()), ("i", pa.int64()), ("v", pa.list_(pa.float32()))])

    def batches():
        for start in range(0, rows, 1 << 18):
            n = min(1 << 18, rows - start)
            flat = pa.array(rng.random(n * NARROW_LIST, dtype=np.float32))
            offsets = pa.array(np.arange(0, (n + 1) * NARROW_LIST, NARROW_LIST, dtype=np.int32))
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(rng.random(n, dtype=np.float32)),
                    pa.array(np.arange(start, start + n, dtype=np.int64)),
                    pa.ListArray.from_arrays(offsets, flat),
                ],
                schema=schema,
            )

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    write_table(reader, path, mode="overwrite", rows_per_group=rows_per_group)
    return path


def write_wide(
    path: str, rows: int, rows_per_group: int, seed: int = 0, label: bool = False
) -> str:
    """Write ``rows`` rows of 200 float32 columns (plus an int64 ``label`` of 10 classes)."""
    from keras_dl.data.ingest import write_table

    rng = np.random.default_rng(seed)
    data = rng.random((rows, WIDE_COLUMNS), dtype=np.float32)
    columns = {f"c{j:03d}": data[:, j] for j in range(WIDE_COLUMNS)}
    if label:  # learnable: which of the first 10 columns is largest
        columns["label"] = np.argmax(data[:, :10], axis=1).astype(np.int64)
    write_table(pa.table(columns), path, mode="overwrite", rows_per_group=rows_per_group)
    return path


def write_floats40(uri: str, rows: int, columns: int, files: int, groups_per_file: int) -> str:
    """The floats40 table at ``uri``: ``columns`` float32 columns and an int64 ``label`` of 10
    classes, one Delta commit per file, so it has ``files`` files of ``groups_per_file`` row
    groups."""
    from keras_dl.data.ingest import write_table

    rng = np.random.default_rng(0)
    per_file = rows // files
    for k in range(files):
        data = {f"f{j:02d}": rng.random(per_file, dtype=np.float32) for j in range(columns)}
        data["label"] = rng.integers(0, 10, per_file)
        write_table(
            pa.table(data),
            uri,
            mode="append" if k else "overwrite",
            rows_per_group=per_file // groups_per_file,
        )
    return uri


def write_images_delta(path: str, count: int, rows_per_group: int, seed: int = 0) -> str:
    """Write ``count`` 64x64 JPEGs (quality 90) plus a label as a Delta table, without Spark."""
    import cv2

    from keras_dl.data.ingest import write_table

    encoded = [
        cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
        for img in _smooth_images(count, seed)
    ]
    table = pa.table(
        {
            "image": pa.array(encoded, type=pa.binary()),
            "label": pa.array(np.arange(count) % 10, type=pa.int64()),
        }
    )
    write_table(table, path, mode="overwrite", rows_per_group=rows_per_group)
    return path


def write_images(root: str, count: int, rows_per_group: int, seed: int = 0) -> tuple[str, str]:
    """Write ``count`` JPEGs as a Petastorm dataset and as a Delta table of the same bytes.

    Returns:
        (petastorm dataset URL, Delta table path).
    """
    import pyarrow.parquet as pq
    from petastorm.codecs import CompressedImageCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql import SparkSession
    from pyspark.sql.types import LongType

    from keras_dl.data.ingest import write_table

    schema = Unischema(
        "BenchImages",
        [
            UnischemaField(
                "image",
                np.uint8,
                (IMAGE_SIZE, IMAGE_SIZE, 3),
                CompressedImageCodec("jpeg", quality=90),
                False,
            ),
            UnischemaField("label", np.int64, (), ScalarCodec(LongType()), False),
        ],
    )
    images = _smooth_images(count, seed)
    url = "file://" + os.path.abspath(os.path.join(root, "images_petastorm"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's pyarrow
    from keras_dl.distribute.loopback import spark_conf

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("keras_dl-bench-input")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in spark_conf("local[2]").items():  # loopback driver, no web UI
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # Row groups of about rows_per_group images (JPEGs of 64x64 are 2-4 kB each).
        mb = max(1, rows_per_group * 4 // 1024)
        with materialize_dataset(spark, url, schema, row_group_size_mb=mb):
            rows = [
                dict_to_spark_row(schema, {"image": images[i], "label": i % 10})
                for i in range(count)
            ]
            df = spark.createDataFrame(rows, schema.as_spark_schema())
            df.coalesce(max(2, count // rows_per_group)).write.mode("overwrite").parquet(url)
    finally:
        spark.stop()
    # The same encoded bytes, read raw from the Petastorm files, go into the Delta table.
    raw = pq.read_table(url[len("file://") :])  # the dataset reader on pyarrow 12 and 25 alike
    delta = os.path.join(root, "images_delta")
    table = pa.table({"image": raw.column("image").cast(pa.binary()), "label": raw["label"]})
    write_table(table, delta, mode="overwrite", rows_per_group=rows_per_group)
    return url, delta


def _smooth_images(count: int, seed: int) -> list[np.ndarray]:
    """Photos are smooth, not noise: blurred noise plus a gradient, like real JPEG content."""
    import cv2

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 120, IMAGE_SIZE, dtype=np.float32)
    out = []
    for _ in range(count):
        noise = rng.random((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32) * 135
        img = cv2.GaussianBlur(noise, (7, 7), 0) + ramp[None, :, None]
        out.append(img.clip(0, 255).astype(np.uint8))
    return out
