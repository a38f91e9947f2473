"""A run's training manifest, built from the snapshots it read and logged as MLflow artifacts.

Per split, ``keras_dl_lineage/manifest.json`` (the header of every split: table identity, row
count, fingerprint) and ``keras_dl_lineage/SPLIT.files.parquet`` (its files and row runs; a
mixed train split's sources are the splits ``train/NAME``, in ``train.NAME.files.parquet``), and
with ``data.lineage_columns`` ``keras_dl_lineage/SPLIT.values.parquet``: those columns' values
at the trained rows, in manifest order, zstd-compressed, so a predicate on them can be answered
after VACUUM removed the files. The run is tagged ``keras_dl.manifest`` (the header's
``runs:/`` URI) and ``keras_dl.fingerprint.SPLIT``; registration copies both to the version.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from keras_dl.data.tables.filters import parse_filters
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.lineage.file_rows import ranges_of, trained_runs
from keras_dl.lineage.manifest import (
    FORMAT,
    FileRows,
    SplitManifest,
    files_table,
    fingerprint,
    to_header,
)

ARTIFACT_DIR = "keras_dl_lineage"
MANIFEST_TAG = "keras_dl.manifest"
FINGERPRINT_PREFIX = "keras_dl.fingerprint."
MANIFEST_NAME = "manifest.json"


@dataclass
class Manifest:
    """A run's split manifests, and per split its lineage columns' values (if any)."""

    splits: dict[str, SplitManifest] = field(default_factory=dict)
    values: dict[str, pa.Table] = field(default_factory=dict)

    def fingerprints(self) -> dict[str, str]:
        return {name: fingerprint(m) for name, m in self.splits.items()}


def build_manifest(
    splits: Iterable[tuple[str, TableSnapshot | None]], data, sources: Iterable = ()
) -> Manifest:
    """The manifest of ``(name, snapshot)`` splits read with the data config ``data``, and of
    a mixed train split's ``sources`` (:class:`keras_dl.data.sources.Source`; ``splits`` then
    holds no ``train``): one split ``train/NAME`` per source, its table at its own version with
    ``data.filters`` and its own filters.

    A source's manifest holds the rows the mix draws its share from. When the share covers
    whole passes every one of them trains each epoch; a smaller share is a sample drawn anew
    each epoch, so a listed row may not have been drawn: ``keras-dl lineage`` counts it as
    trained, the answer an erasure can act on.

    Raises:
        DataError: A ``data.lineage_columns`` column the table lacks, or a file that cannot be
            read (only files read through a row filter or for lineage columns are opened).
    """
    out = Manifest()
    for name, snapshot in splits:
        if snapshot is None:
            continue
        selector = _selector(data, name, snapshot)
        m, values = split_manifest(name, snapshot, data.filters, selector, data.lineage_columns)
        out.splits[name] = m
        if values is not None:
            out.values[name] = values
    own = {s.name: tuple(s.filters) for s in data.sources}  # data.replay's sources have none
    for source in sources:
        name = f"train/{source.name}"
        selector = _selector(data, "train", source.snapshot)
        filters = (*data.filters, *own.get(source.name, ()))
        m, values = split_manifest(name, source.snapshot, filters, selector, data.lineage_columns)
        out.splits[name] = m
        if values is not None:
            out.values[name] = values
    return out


def split_manifest(
    name: str,
    snapshot: TableSnapshot,
    filters: Iterable[str] = (),
    selector: tuple[str, str] | None = None,
    lineage_columns: Iterable[str] = (),
) -> tuple[SplitManifest, pa.Table | None]:
    """The rows ``snapshot`` reads as split ``name``, and ``lineage_columns``' values at them.

    Args:
        name: The split ("train", "validation", "test").
        snapshot: The split's snapshot (filters and split selector applied).
        filters: ``data.filters`` as given (recorded parsed, for the fingerprint).
        selector: ``(split column, value)`` that chose the split, or None.
        lineage_columns: Columns whose values to keep for the trained rows.
    """
    columns = tuple(lineage_columns)
    missing = [c for c in columns if c not in snapshot.schema.names]
    if missing:
        raise DataError(
            f"data.lineage_columns {missing} are not columns of table {snapshot.uri!r}. Its "
            f"columns: {', '.join(snapshot.schema.names)}. Name columns of the table."
        )
    files, parts = [], []
    for i, uri in enumerate(snapshot.files):
        info = snapshot.file_info[i] if snapshot.file_info else {"path": uri}
        found, values = trained_runs(snapshot, i, columns)
        files.append(
            FileRows(
                path=info["path"],
                size=info.get("size"),
                deletion_vector=info.get("deletionVector"),
                base_row_id=info.get("baseRowId"),
                ranges=ranges_of(found),
            )
        )
        if values is not None:
            parts.append(values)
    parsed = parse_filters(list(filters), snapshot.schema) if filters else []
    m = SplitManifest(
        split=name,
        table=snapshot.uri,
        table_id=snapshot.table_id,
        format=snapshot.format,
        version=snapshot.version,
        since_version=snapshot.since_version,
        filters=tuple((c, op, json.dumps(v, default=str)) for c, op, v in parsed),
        selector=selector,
        files=tuple(files),
        lineage_columns=columns,
    )
    values = None
    if columns:
        schema = pa.schema([snapshot.schema.field(c) for c in columns])
        values = pa.concat_tables(parts) if parts else schema.empty_table()
    return m, values


def log_manifest(client, run_id: str, manifest: Manifest) -> dict[str, str]:
    """Log ``manifest`` as the run's ``keras_dl_lineage/`` artifacts; tag the run with where
    it is and each split's fingerprint. Returns those tags."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="keras_dl_lineage-") as tmp:
        headers = {}
        for name, m in manifest.splits.items():
            stem = name.replace("/", ".")  # a mixed source's train/NAME: one folder, flat
            files = f"{stem}.files.parquet"
            pq.write_table(files_table(m), os.path.join(tmp, files), compression="zstd")
            values = None
            if name in manifest.values:
                values = f"{stem}.values.parquet"
                pq.write_table(manifest.values[name], os.path.join(tmp, values), compression="zstd")
            headers[name] = to_header(m, files, values)
        with open(os.path.join(tmp, MANIFEST_NAME), "w") as f:
            json.dump({"format": FORMAT, "splits": headers}, f, indent=1, sort_keys=True)
        client.log_artifacts(run_id, tmp, ARTIFACT_DIR)
    tags = {MANIFEST_TAG: f"runs:/{run_id}/{ARTIFACT_DIR}/{MANIFEST_NAME}"}
    tags.update({FINGERPRINT_PREFIX + k: v for k, v in manifest.fingerprints().items()})
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    return tags


def version_tags(run_tags: dict[str, str]) -> dict[str, str]:
    """The lineage tags a registered version copies from its run: the manifest, the
    fingerprints and the warm start (``keras_dl.init_from``)."""
    keep = (MANIFEST_TAG, "keras_dl.init_from", "keras_dl.init_from.run_id")
    return {k: v for k, v in run_tags.items() if k in keep or k.startswith(FINGERPRINT_PREFIX)}


def manifest_size(manifest: Manifest) -> int:
    """Bytes the manifest's artifacts take, as :func:`log_manifest` writes them."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="keras_dl_lineage-") as tmp:
        total = 0
        for name, m in manifest.splits.items():
            path = os.path.join(tmp, f"{name}.files.parquet")
            pq.write_table(files_table(m), path, compression="zstd")
            total += os.path.getsize(path)
            if name in manifest.values:
                pq.write_table(manifest.values[name], path, compression="zstd")
                total += os.path.getsize(path)
            total += len(json.dumps(to_header(m, "x", None), indent=1))
        return total


def _selector(data, name: str, snapshot: TableSnapshot) -> tuple[str, str] | None:
    own = {"validation": data.validation_table, "test": data.test_table}.get(name)
    if own or not data.split_column:
        return None
    value = {"train": data.train_split, "validation": data.validation_split}.get(name)
    return data.split_column, str(value if value is not None else data.test_split)
