"""Write any TensorFlow Datasets (TFDS) dataset into a Delta table.

Images stay encoded (JPEG/PNG bytes, decoded later in tf.data by ``keras_dl.data.tables.images``),
class labels become int64 plus a ``<name>_name`` string column, text becomes strings, and
fixed-shape tensors become list columns. Rows are partitioned by ``split``. ``--resplit
0.8,0.1,0.1`` re-splits all rows (stratified, seeded) into train/validation/test, for datasets
such as ``tf_flowers`` that ship only a train split.

Example::

    keras-dl ingest tfds tf_flowers --to data/flowers --resplit 0.8,0.1,0.1
    keras-dl ingest tfds mnist --to data/mnist --split train,test

``--rows-per-group 0`` (the default) sizes row groups to about 16 MB each.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence

import numpy as np

from keras_dl.errors import DataError

ROWS_PER_GROUP = 0  # auto: about 16 MB per row group
_BATCH_ROWS = 256  # rows converted at a time (the first batch also sizes the row groups)
log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl ingest tfds`` arguments (``--to``/``--mode``/``--rows-per-group`` come
    from the CLI)."""
    p.add_argument("name", help="TFDS dataset name, optionally with config/version: mnist:3.*.*")
    p.add_argument("--split", default="", help="comma-separated TFDS splits (default: all)")
    p.add_argument(
        "--data-dir", default=None, help="TFDS data dir (default: ~/tensorflow_datasets)"
    )
    p.add_argument(
        "--resplit",
        default="",
        metavar="TRAIN,VAL,TEST",
        help="re-split all rows into train/validation/test by these fractions (stratified)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for --resplit (default: 0)")


def run(args) -> int:
    """Ingest and print the report."""
    from keras_dl.data.ingest.datasets import parse_fractions

    splits = [s.strip() for s in args.split.split(",") if s.strip()]
    report = ingest_tfds(
        args.name,
        args.to,
        splits=splits,
        data_dir=args.data_dir,
        mode=args.mode,
        rows_per_group=args.rows_per_group,
        resplit=parse_fractions(args.resplit),
        seed=args.seed,
    )
    print(report)
    return 0


def ingest_tfds(
    name: str,
    to: str,
    splits: Sequence[str] = (),
    data_dir: str | None = None,
    mode: str = "error",
    rows_per_group: int = 0,
    resplit: Sequence[float] = (),
    seed: int = 0,
):
    """Download (if needed) and prepare a TFDS dataset, then write it as a Delta table.

    Args:
        name: TFDS name, e.g. "tf_flowers" or "mnist:3.*.*".
        to: Delta table path to write.
        splits: TFDS splits to write. Defaults to all the dataset has.
        data_dir: TFDS data folder. Defaults to TFDS's own (~/tensorflow_datasets).
        mode: "error", "append", "overwrite" or "ignore" if the table exists. Defaults to "error".
        rows_per_group: Rows per row group; 0 sizes groups to ~16 MB. Defaults to 0.
        resplit: (train, validation, test) fractions to re-split all rows. Defaults to ().
        seed: Seed for ``resplit``. Defaults to 0.

    Raises:
        DataError: For an unknown dataset, or one that is not prepared and cannot be downloaded.
    """
    import pyarrow as pa
    import tensorflow_datasets as tfds

    from keras_dl.data.ingest.datasets import assign_splits, rows_per_group_for, write_table

    builder = _prepare(tfds, name, data_dir)
    splits = list(splits) or list(builder.info.splits)
    if not splits:
        raise DataError(f"TFDS dataset {name!r} has no splits. Pass --split NAME.")
    columns = _columns(tfds, builder.info.features)
    if not columns:
        raise DataError(f"TFDS dataset {name!r} has no feature keras_dl can store.")
    decoders = {k: tfds.decode.SkipDecoding() for k, kind in columns.items() if kind == "image"}

    def examples() -> Iterator[tuple[str, dict]]:
        for split in splits:
            try:
                ds = builder.as_dataset(split=split, decoders=decoders or None)
            except (ValueError, KeyError) as exc:
                raise DataError(
                    f"TFDS dataset {name!r} has no split {split!r} ({exc}). Its splits: "
                    f"{', '.join(builder.info.splits) or 'unknown'}."
                ) from None
            for ex in tfds.as_numpy(ds):
                yield split, ex

    features = builder.info.features
    if resplit:
        # Stratifying needs every label first: materialize (fine for datasets TFDS ships).
        rows = list(examples())
        labels = np.array([_stratum(ex, columns) for _, ex in rows])
        names = assign_splits(labels, resplit, seed)
        stream: Iterator = ((n, ex) for n, (_, ex) in zip(names, rows))
    else:
        stream = examples()
    batches = _batches(features, columns, stream, _BATCH_ROWS)
    first = next(batches, None)
    if first is None:
        raise DataError(f"TFDS dataset {name!r} splits {splits} hold no rows.")
    if rows_per_group <= 0:
        rows_per_group = rows_per_group_for(first.nbytes / first.num_rows)
    reader = pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], batches))
    log.info("Writing %s to %s in row groups of %d rows", name, to, rows_per_group)
    return write_table(reader, to, partition_by=["split"], mode=mode, rows_per_group=rows_per_group)


def _prepare(tfds, name: str, data_dir: str | None):
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as exc:  # DatasetNotFoundError and friends
        raise DataError(
            f"TFDS has no dataset {name!r} ({str(exc).splitlines()[0]}). See "
            "https://www.tensorflow.org/datasets/catalog for the names."
        ) from None
    try:
        with _few_download_retries():
            builder.download_and_prepare()
    except ModuleNotFoundError as exc:
        # tensorflow-datasets imports some packages only to prepare (e.g. importlib_resources).
        raise DataError(
            f"TFDS cannot prepare dataset {name!r}: the Python package {exc.name!r} it needs is "
            f"not installed. Install it (pip install {exc.name}) and retry."
        ) from None
    except Exception as exc:
        raise DataError(
            f"TFDS dataset {name!r} is not prepared in {builder.data_dir!r} and could not be "
            f"downloaded ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). On a machine "
            f"with network run `tfds build {name} --data_dir DIR` (or this command), copy DIR "
            "here and pass --data-dir DIR."
        ) from None
    return builder


@contextlib.contextmanager
def _few_download_retries(retries: int = 2):
    """Cap TFDS's download retries while preparing.

    TFDS retries a failed download 10 times with exponential back-off, so on a machine without
    network the answer takes about 3.5 minutes; 2 retries still ride out a passing error.
    """
    from tensorflow_datasets.core.download import downloader

    before = getattr(downloader, "MAX_RETRIES", None)
    if before is not None:
        downloader.MAX_RETRIES = min(before, retries)
    try:
        yield
    finally:
        if before is not None:
            downloader.MAX_RETRIES = before


def _columns(tfds, features) -> dict[str, str]:
    """Top-level feature name -> how it is stored: image, label, text or tensor."""
    f = tfds.features
    out = {}
    for key, feat in features.items():
        if isinstance(feat, f.Image):
            out[key] = "image"
        elif isinstance(feat, f.ClassLabel):
            out[key] = "label"
        elif isinstance(feat, f.Text):
            out[key] = "text"
        elif isinstance(feat, f.Tensor) and not isinstance(feat, f.FeaturesDict):
            out[key] = "tensor"
        else:
            log.warning("Skipping TFDS feature %r (%s): not storable as a column.", key, feat)
    return out


def _stratum(ex: dict, columns: dict[str, str]):
    labels = [k for k, kind in columns.items() if kind == "label"]
    return ex[labels[0]] if labels else 0


def _batches(features, columns, stream, size: int):
    while True:
        batch = _to_batch(features, columns, [row for _, row in zip(range(size), stream)])
        if batch is None:
            return
        yield batch


def _to_batch(features, columns: dict[str, str], chunk):
    import pyarrow as pa

    if not chunk:
        return None
    data = {}
    for key, kind in columns.items():
        values = [ex[key] for _, ex in chunk]
        if kind == "image":
            data[key] = pa.array(values, pa.binary())
        elif kind == "label":
            data[key] = pa.array(np.asarray(values, dtype=np.int64))
            data[f"{key}_name"] = pa.array([features[key].int2str(int(v)) for v in values])
        elif kind == "text":
            data[key] = pa.array([v.decode("utf-8", "replace") for v in values], pa.string())
        else:
            data[key] = _tensor_column(values)
    data["split"] = pa.array([split for split, _ in chunk], pa.string())
    return pa.RecordBatch.from_pydict(data)


def _tensor_column(values):
    """Numeric scalars as a column; n-d arrays as nested lists (a fixed shape stays dense)."""
    import pyarrow as pa

    arrays = [np.asarray(v) for v in values]
    if arrays[0].ndim == 0:
        return pa.array(np.stack(arrays))
    if any(a.shape != arrays[0].shape for a in arrays):
        return pa.array([a.tolist() for a in arrays])  # ragged: kept, refused at read time
    stacked = np.stack(arrays)
    col = pa.array(stacked.reshape(-1))
    for dim in reversed(stacked.shape[1:]):
        offsets = pa.array(np.arange(0, len(col) + 1, dim, dtype=np.int32))
        col = pa.ListArray.from_arrays(offsets, col)
    return col
