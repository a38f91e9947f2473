"""Write datasets into Delta tables that the data path reads well.

Row groups are the unit of sharding and shuffling, so ingest writes them at a deliberate size
(``rows_per_group``) and reports the version it committed (read from its own commit, not the
latest, which another writer may have moved on) with that version's rows, files and row groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from keras_dl.errors import DataError

MODES = ("error", "append", "overwrite", "ignore")


@dataclass(frozen=True)
class IngestReport:
    """What an ingest wrote."""

    table: str
    version: int
    rows: int
    files: int
    row_groups: int

    def __str__(self) -> str:
        return (
            f"Delta table {self.table} version {self.version}: {self.rows} rows in "
            f"{self.files} file(s), {self.row_groups} row group(s)"
        )


def write_table(
    table: pa.Table | pa.RecordBatchReader,
    to: str,
    partition_by: Sequence[str] = (),
    mode: str = "error",
    rows_per_group: int = 4096,
) -> IngestReport:
    """Write an Arrow table as a Delta table with row groups of ``rows_per_group`` rows.

    Args:
        table: The rows to write: a table, or a ``RecordBatchReader`` to stream rows that do
            not fit in memory (one Delta commit either way).
        to: Delta table path or URI.
        partition_by: Partition columns. Defaults to ().
        mode: "error" if the table exists, "append", "overwrite", or "ignore" (keep the
            existing table untouched). Defaults to "error".
        rows_per_group: Rows per Parquet row group. Defaults to 4096.
    """
    from keras_dl.data.ingest.parquet_files import write_files
    from keras_dl.data.ingest.spark_delta import commit
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.stats import scan_table
    from keras_dl.storage import check_safe_delta_writes, delta_storage_options, open_storage

    if mode not in MODES:
        raise DataError(f"Ingest mode {mode!r} is not one of {', '.join(MODES)}.")
    if rows_per_group < 1:
        raise DataError(f"rows_per_group must be >= 1, got {rows_per_group}.")
    exists = any(name.endswith(".json") for name, _ in open_storage(to).list("_delta_log"))
    if exists and mode == "error":
        raise DataError(
            f"Delta table {to!r} already exists. Pass --mode overwrite to replace it (a new "
            "version; the old one stays readable by time travel), --mode append, or --mode ignore."
        )
    version = None  # "ignore" on an existing table: nothing is written, report the latest
    if not (exists and mode == "ignore"):
        check_safe_delta_writes(to)  # S3: refused where a writer expects a DynamoDB lock
        batches = table.to_reader() if isinstance(table, pa.Table) else table
        current = None
        if exists:
            current, partition_by = _table_schema(to, partition_by)
        # Parquet files with page checksums (delta-rs cannot write them), committed once. The
        # version is this commit's, not the latest: another writer may have committed after it.
        schema, actions = write_files(batches, to, partition_by, rows_per_group, current)
        version = commit(
            to,
            schema,
            actions,
            "append" if mode == "append" else "overwrite",
            exists,
            delta_storage_options(to),
            partition_by,
        )
    snapshot = open_table(to, version)
    stats = scan_table(snapshot)  # one footer read per file; deletion vectors counted
    return IngestReport(
        table=to,
        version=snapshot.version,
        rows=stats.rows,
        files=stats.files,
        row_groups=stats.row_groups,
    )


def _table_schema(to: str, partition_by: Sequence[str]) -> tuple[pa.Schema, Sequence[str]]:
    """An existing table's Arrow schema and partition columns (``partition_by`` must be them,
    or empty)."""
    from deltalake import DeltaTable

    from keras_dl.storage import delta_storage_options

    table = DeltaTable(to, storage_options=delta_storage_options(to) or None)
    columns = table.metadata().partition_columns
    if partition_by and list(partition_by) != list(columns):
        raise DataError(
            f"Delta table {to!r} is partitioned by {columns}, not {list(partition_by)}: "
            "append or overwrite with its partitioning, or write a new table."
        )
    return pa.schema(table.schema().to_arrow()), columns


def rows_per_group_for(row_bytes: float, target_bytes: int = 16 << 20) -> int:
    """Rows per group so that a group holds about ``target_bytes`` (a power of 2, 64-16384).

    Row groups are what a reader holds in memory and what shards and shuffles: ~16 MB keeps a
    few of them cheap to buffer while giving a mid-size dataset dozens of groups to spread.
    """
    rows = max(1.0, target_bytes / max(row_bytes, 1.0))
    return int(min(16384, max(64, 2 ** int(np.log2(rows)))))


def assign_splits(labels: np.ndarray, fractions: Sequence[float], seed: int = 0) -> np.ndarray:
    """A "train"/"validation"/"test" name per row, by ``fractions``, stratified by label.

    Args:
        labels: One label per row (the split keeps each class's proportions).
        fractions: Train, validation and test fractions, summing to 1 (a zero drops a split).
        seed: Shuffle seed, so the same rows land in the same split every time. Defaults to 0.
    """
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
        raise DataError(
            f"Split fractions {list(fractions)} must be three non-negative numbers (train, "
            "validation, test) that sum to 1, for example 0.8,0.1,0.1."
        )
    rng = np.random.default_rng(seed)
    out = np.empty(len(labels), dtype=object)
    bounds = np.cumsum(fractions)[:2]
    for value in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == value))
        cut = np.round(bounds * len(idx)).astype(int)
        for name, part in zip(("train", "validation", "test"), np.split(idx, cut)):
            out[part] = name
    return out


def parse_fractions(text: str) -> tuple[float, ...]:
    """``"0.8,0.1,0.1"`` -> ``(0.8, 0.1, 0.1)``; an empty string -> ``()``."""
    if not text:
        return ()
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise DataError(f"--resplit {text!r} must be three numbers like 0.8,0.1,0.1.") from None


def ingest_sklearn_digits(
    to: str, mode: str = "error", rows_per_group: int = 128, seed: int = 0
) -> IngestReport:
    """Write scikit-learn's bundled digits (1,797 8x8 images) as a Delta table.

    Columns: ``pixels`` (64 float32 values, 0-16, row-major 8x8), ``label`` (int64, 0-9) and
    ``split`` ("train" 70%, "validation" 10%, "test" 20%, stratified), partitioned by ``split``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    idx = np.arange(len(digits.target))
    rest, test = train_test_split(idx, test_size=0.2, random_state=seed, stratify=digits.target)
    train, val = train_test_split(
        rest, test_size=0.125, random_state=seed, stratify=digits.target[rest]
    )
    split = np.empty(len(idx), dtype=object)
    split[train], split[val], split[test] = "train", "validation", "test"
    table = pa.table(
        {
            "pixels": pa.array(list(digits.data.astype(np.float32)), pa.list_(pa.float32())),
            "label": pa.array(digits.target.astype(np.int64)),
            "split": pa.array(split.tolist(), pa.string()),
        }
    )
    return write_table(table, to, partition_by=["split"], mode=mode, rows_per_group=rows_per_group)
