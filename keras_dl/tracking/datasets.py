"""The datasets a run read, logged as MLflow dataset inputs (the UI's Datasets panel).

Each split (train, validation, test) becomes one ``mlflow.log_inputs`` entry with context
``training`` / ``validation`` / ``test``: a metadata-only dataset (no rows are copied) whose
source is the Delta table and version read (MLflow's ``delta_table`` source, the one
``mlflow.data.from_spark(..., version=)`` records), or the Parquet folder, with the columns the
model reads as its schema and the split's live rows as its profile. The table's rows are never
loaded for this: the counts come from the snapshot keras_dl planned the epoch with.

A run on what changed (``data.since_version``) reads the version range ``(since, version]``:
MLflow's ``delta_table`` source has one version field, so it holds the range's end, the
dataset's name carries the range (``table@(3,5]:train``), and the profile and the source's
``delta_table_since_version`` its start. :func:`range_params` gives the run's params for it.

A dataset's digest is the split's fingerprint (:mod:`keras_dl.lineage.manifest`: a SHA-256 over
the table id, the version range, the filters, the split and each file's path, size, deletion
vector and trained rows), cut to the 36 characters MLflow keeps; the profile holds it whole.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

import pyarrow as pa

from keras_dl.data.tables.snapshot import TableSnapshot

CONTEXTS = {"train": "training", "validation": "validation", "test": "test"}
DIGEST_CHARS = 36  # MLflow's limit on a dataset digest (mlflow.utils.validation)


def log_datasets(
    client,
    run_id: str,
    splits: Iterable[tuple[str, object]],
    columns,
    fingerprints: dict[str, str] | None = None,
) -> None:
    """Log each ``(name, SplitData)`` of ``splits`` (None ones skipped) as an input of the run.

    Args:
        client: An ``mlflow.MlflowClient`` on the run's tracking store.
        run_id: The run.
        splits: ``(name, split)`` pairs, name in ``train``, ``validation``, ``test``.
        columns: The columns the model reads (features, label, weight), in order.
        fingerprints: Per split, the SHA-256 naming its rows (:mod:`keras_dl.lineage`): the
            dataset's digest is its first 36 hex digits (MLflow keeps 36 characters), the
            profile holds it whole; a mixed train split's sources are ``train/NAME``.
            Defaults to none (the digest of the source and profile).
    """
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for name, split in splits:
        if split is None:
            continue
        tag = InputTag(key=MLFLOW_DATASET_CONTEXT, value=CONTEXTS[name])
        stream = getattr(split, "stream", None)
        if name == "train" and hasattr(stream, "rows_by_source"):  # data.sources: one each
            mix = stream.mix
            for i, source in enumerate(stream.names):
                extra = {"weight": mix.weights[i], "epoch_share": mix.shares[i]}
                split_name = f"train/{source}"
                dataset = table_dataset(
                    stream.snapshots[i],
                    stream.all_stats[i].rows,
                    split_name,
                    columns,
                    (fingerprints or {}).get(split_name),
                    extra=extra,
                )
                inputs.append(DatasetInput(dataset=dataset._to_mlflow_entity(), tags=[tag]))
            continue
        fingerprint = (fingerprints or {}).get(name)
        dataset = table_dataset(split.snapshot, split.stats.rows, name, columns, fingerprint)
        inputs.append(DatasetInput(dataset=dataset._to_mlflow_entity(), tags=[tag]))
    if inputs:
        client.log_inputs(run_id, datasets=inputs)


def table_dataset(
    snapshot: TableSnapshot,
    rows: int,
    split: str,
    columns,
    fingerprint: str | None = None,
    extra: dict | None = None,
):
    """A metadata-only MLflow dataset naming ``snapshot``'s table, version and ``rows``; with
    ``fingerprint``, its digest is the fingerprint's first :data:`DIGEST_CHARS` characters
    (``extra``: more profile entries, a mixed source's weight and share)."""

    source = _source(snapshot)
    version = "" if snapshot.version is None else f"@v{snapshot.version}"
    if snapshot.since_version is not None:
        version = f"@({snapshot.since_version},{snapshot.version}]"
    name = f"{snapshot.uri.rstrip('/').rsplit('/', 1)[-1]}{version}:{split}"
    since = {} if snapshot.since_version is None else {"since_version": snapshot.since_version}
    identity = {} if snapshot.table_id is None else {"table_id": snapshot.table_id}
    named = {} if fingerprint is None else {"fingerprint": fingerprint}
    profiled, _ = _classes()
    return profiled(
        source=source,
        name=name,
        schema=_schema(snapshot.schema, columns),
        profile={
            "num_rows": int(rows),
            "num_files": len(snapshot.files),
            "table": snapshot.uri,
            "version": snapshot.version,
            **since,
            "format": snapshot.format,
            "split": split,
            **identity,
            **named,
            **(extra or {}),
        },
    )


def range_params(snapshot: TableSnapshot) -> dict[str, str]:
    """The version range a run on what changed read, as run params: ``data.since_version_read``
    and ``data.version_read`` (resolved, also for ``since_timestamp`` and a latest ``version``)
    and ``data.version_range`` (``(3,5]``). Empty for a whole-table read."""
    if snapshot.since_version is None:
        return {}
    return {
        "data.since_version_read": str(snapshot.since_version),
        "data.version_read": str(snapshot.version),
        "data.version_range": f"({snapshot.since_version},{snapshot.version}]",
    }


def _source(snapshot: TableSnapshot):
    if snapshot.versioned:
        _, versioned = _classes()
        source = versioned(path=snapshot.uri, delta_table_version=snapshot.version)
        source.since_version = snapshot.since_version
        return source
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    return resolve_dataset_source(snapshot.uri)


def _schema(schema: pa.Schema, columns):
    from mlflow.types.schema import ColSpec, Schema

    specs = [ColSpec(_mlflow_type(schema.field(c).type), c) for c in columns if c in schema.names]
    return Schema(specs) if specs else None


def _mlflow_type(kind: pa.DataType):
    from mlflow.types.schema import Array, DataType

    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return Array(_mlflow_type(kind.value_type))
    for check, name in (
        (pa.types.is_boolean, "boolean"),
        (pa.types.is_int64, "long"),
        (pa.types.is_integer, "integer"),
        (pa.types.is_float32, "float"),
        (pa.types.is_floating, "double"),
        (pa.types.is_timestamp, "datetime"),
        (pa.types.is_binary, "binary"),
        (pa.types.is_large_binary, "binary"),
    ):
        if check(kind):
            return DataType[name]
    return DataType.string  # strings, dates, decimals and anything else: named as text


@functools.cache
def _classes():
    """The MLflow classes keras_dl extends, built on first use (mlflow imports late)."""
    from mlflow.data.delta_dataset_source import DeltaDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    class ProfiledDataset(MetaDataset):
        """A MetaDataset with a profile (the UI shows it beside the schema)."""

        def __init__(self, source, name, schema, profile):
            self._profile = profile
            super().__init__(source=source, name=name, schema=schema)

        def _compute_digest(self) -> str:
            import hashlib

            if self._profile.get("fingerprint"):  # the rows' own name (keras_dl.lineage)
                return self._profile["fingerprint"][:DIGEST_CHARS]
            body = json.dumps(
                {"source": self.source.to_json(), "profile": self._profile}, sort_keys=True
            )
            return hashlib.sha256(body.encode()).hexdigest()[:8]

        @property
        def profile(self):
            return self._profile

        def to_dict(self):
            return {**super().to_dict(), "profile": json.dumps(self._profile)}

    class VersionedDeltaSource(DeltaDatasetSource):
        """MLflow's ``delta_table`` source, keeping version 0 (MLflow drops a falsy version)."""

        def to_dict(self):
            info = super().to_dict()
            if self.delta_table_version is not None:
                info["delta_table_version"] = self.delta_table_version
            if getattr(self, "since_version", None) is not None:
                info["delta_table_since_version"] = self.since_version  # the range's start
            return info

    return ProfiledDataset, VersionedDeltaSource
