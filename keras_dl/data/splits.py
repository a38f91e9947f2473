"""From a :class:`~keras_dl.config.DataConfig` to the train, validation and test datasets.

This is the data module a training run uses: it resolves the table once (one version for all
splits), plans the columns from the schema, and builds each split's pipeline sharded for this
process's rank.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from keras_dl.config import DataConfig
from keras_dl.data.labels import class_weights
from keras_dl.data.sources import check_same_columns, mixes, open_sources
from keras_dl.data.sources import epoch_rows as mixed_epoch_rows
from keras_dl.data.stream.features import NUMERIC, ColumnPlan, plan_columns
from keras_dl.data.stream.tfdata import (
    ReadOptions,
    SplitData,
    make_dataset,
    make_mixed_dataset,
    original_errors,
)
from keras_dl.data.tables import open_table
from keras_dl.data.tables.disk_copy import cache_files
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.data.tables.images import configure
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.tables.stats import count_rows
from keras_dl.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class DataSplits:
    """The datasets of one run, their column plan and the table's lineage.

    ``full`` is set for a run on the changed rows (``data.since_version`` or
    ``data.since_timestamp``): the evaluation split the registry gate uses (test, else
    validation) over the whole table at the same version, so the gate sees what the model
    forgot of the older rows (:mod:`keras_dl.model.gate`); None otherwise, and for a split read from
    its own table (``data.test_table``, ``data.validation_table``), which is whole already.
    """

    train: SplitData
    validation: SplitData | None
    test: SplitData | None
    plan: ColumnPlan
    snapshot: TableSnapshot
    hooks: tuple = field(default=(), repr=False)
    full: SplitData | None = None
    sources: tuple = ()
    source_tests: dict = field(default_factory=dict)

    @property
    def full_prefix(self) -> str:
        """The metric prefix of ``full``: "full_test_", or "full_val_" without a test split."""
        return "full_test_" if self.test is not None else "full_val_"

    def bad_images_skipped(self) -> int:
        """Undecodable images dropped so far by the image hooks (``data.on_bad_image=skip``)."""
        return sum(h.skipped() for h in self.hooks if hasattr(h, "skipped"))

    def original_errors(self):
        """A ``with`` block in which an error tf.data raises while reading these splits is
        raised as the reader's own DataError (``with data.original_errors(): model.fit(...)``)."""
        return original_errors(self.train, self.validation, self.test)


def make_splits(
    data: DataConfig,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    accept: Sequence[str] = (NUMERIC,),
    preprocess: Callable | None = None,
    preprocess_train: Callable | None = None,
    class_weight: tuple[str, ...] = (),
) -> DataSplits:
    """Open ``data.table`` and build the train/validation/test pipelines for this rank.

    Args:
        data: The data config.
        batch_size: Rows per batch of this rank's datasets.
        rank: This process's rank, which is its shard of the training rows. Defaults to 0.
        world_size: Number of ranks. Defaults to 1.
        accept: Feature kinds the recipe consumes. Defaults to numeric.
        preprocess: Vectorized ``fn(features, label)`` for every split. Defaults to None.
        preprocess_train: Replaces ``preprocess`` on the training split (augmentation).
            Defaults to None.
        class_weight: ``train.class_weight`` ("balanced" or "LABEL:WEIGHT" pairs), applied
            with ``data.weight_column`` to every split's rows. Defaults to ().
    """
    # data.image_size / data.on_bad_image reach the recipe's image hooks here.
    preprocess, preprocess_train = configure(preprocess, data), configure(preprocess_train, data)
    sources = open_sources(data) if mixes(data) else []
    if sources and not data.table:  # each source's own evaluation splits
        snapshot = train_snap = sources[0].snapshot
    else:
        snapshot = _open(data, data.table, data.version, data.timestamp, changes=True)
        train_snap = _split(snapshot, data, data.train_split, "data.train_split")
    if sources:
        train_snap = sources[0].snapshot
    if not snapshot.files:
        raise DataError(
            f"Table {snapshot.uri!r} (version {snapshot.version}) is empty: it has no data files. "
            "Write rows to it first, or point data.table/data.version at a table with data."
        )
    if train_snap is None or not train_snap.files:
        raise DataError(
            f"Table {snapshot.uri!r} has no rows with {data.split_column} = {data.train_split!r}"
            f" (its partitions: {_partition_values(snapshot, data.split_column)}). Fix "
            "data.train_split or data.split_column."
        )
    exclude = [data.split_column] if data.split_column else []
    plan = plan_columns(
        train_snap,
        data.features,
        data.label,
        exclude,
        accept,
        weight=data.weight_column,
        pack=data.pack_features,
    )
    if class_weight and plan.label is not None:
        plan = dataclasses.replace(
            plan, class_weights=class_weights(data, class_weight, train_snap)
        )
    common = dict(
        shuffle=data.shuffle,
        shuffle_buffer=data.shuffle_buffer,
        seed=data.seed,
        # One reader thread makes the seeded order reproducible (threads finish in any order).
        workers=1 if data.deterministic else data.workers,
        cache_max_bytes=data.cache_max_bytes if data.cache == "auto" else 0,
        io_concurrency=data.io_concurrency,
        io_max_bytes=data.io_max_bytes,
    )
    train_options = ReadOptions(
        batch_size, training=True, shard=rank, num_shards=world_size, **common
    )
    if sources:
        check_same_columns(sources, plan)
        rows = [count_rows(s.snapshot, plan.columns).rows for s in sources]
        train = make_mixed_dataset(
            [s.name for s in sources],
            [s.snapshot for s in sources],
            [s.weight for s in sources],
            plan,
            train_options,
            mixed_epoch_rows(data, rows),
            preprocess_train or preprocess,
        )
    else:
        train = make_dataset(train_snap, plan, train_options, preprocess_train or preprocess)
    evals = {}
    # Class weights train only (as Keras' class_weight); the weight column weighs all.
    plan_eval = dataclasses.replace(plan, class_weights=())
    options = ReadOptions(batch_size, **common)
    by_source = {}
    if sources and not data.table:
        by_source = _source_tests(data, plan_eval, options, preprocess)
        if not data.validation_table:
            _warn_unused_validation(data)
    for name, table, split in (
        ("validation", data.validation_table, data.validation_split),
        ("test", data.test_table, data.test_split),
    ):
        if sources and not data.table and not table:
            evals[name] = None
            continue
        snap = _open(data, table) if table else _split(snapshot, data, split, f"data.{name}_split")
        if snap is None or not snap.files:
            evals[name] = None
            continue
        try:
            evals[name] = make_dataset(snap, plan_eval, options, preprocess)
        except DataError as exc:
            if table or "has no rows" not in str(exc):
                raise
            log.warning("No %s rows in %s; skipping %s.", name, snapshot.uri, name)
            evals[name] = None
    hooks = tuple(h for h in (preprocess, preprocess_train) if h is not None)
    full = None
    if snapshot.since_version is not None:
        full_snap = _full_eval_snapshot(data, snapshot, evals)
        if full_snap is not None:
            full = make_dataset(full_snap, plan_eval, options, preprocess)
    if sources and data.table and evals["test"] is not None:
        by_source = _source_tests(data, plan_eval, options, preprocess)
    out = DataSplits(train, evals["validation"], evals["test"], plan, train_snap, hooks, full)
    out.sources = tuple(sources)
    out.source_tests = by_source
    return out


def _source_tests(data: DataConfig, plan, options, preprocess) -> dict:
    """Each ``data.sources`` entry's test split (``data.split_column = data.test_split`` of its
    table at its version, all of it, not only its rows since ``since_version``), by name."""
    out = {}
    if not data.split_column or not data.test_split:
        return out
    for source in data.sources:
        snap = _source_split(data, source, data.test_split, "data.test_split")
        if snap is not None and snap.files:
            out[source.name] = make_dataset(snap, plan, options, preprocess)
    return out


def _source_split(data: DataConfig, source, value: str, key: str):
    """A ``data.sources`` entry's rows where ``data.split_column = value``: its table at its
    version with its filters, all of it (not only its rows since ``since_version``)."""
    whole = _open(data, source.table, source.version)
    if source.filters:
        whole = select(whole, parse_filters(source.filters, whole.schema))
    return _split(whole, data, value, key)


def _warn_unused_validation(data: DataConfig) -> None:
    """Say so when ``data.sources`` without ``data.table`` leave their own validation rows
    unused: the run then has no validation split, and early stopping watches the training
    loss (:func:`keras_dl.run.callbacks.make_callbacks`)."""
    if not data.split_column or not data.validation_split:
        return
    unused = []
    for source in data.sources:
        snap = _source_split(data, source, data.validation_split, "data.validation_split")
        rows = count_rows(snap, [data.split_column]).rows if snap is not None and snap.files else 0
        if rows:
            unused.append(f"{source.name} ({rows})")
    if unused:
        log.warning(
            "data.sources without data.table: the sources' own rows where %s = %r are not "
            "used (%s), so this run has no validation split and early stopping watches the "
            "training loss. Set data.validation_table to the table to validate on, or "
            "data.table to the table whose validation and test splits evaluate the mix.",
            data.split_column,
            data.validation_split,
            ", ".join(unused),
        )


def _open(
    data: DataConfig, table: str, version=None, timestamp=None, changes=False
) -> TableSnapshot:
    """Open a table with ``data.filters`` applied and, with ``data.cache_dir``, cached locally;
    with ``changes``, only the rows ``data.since_version``/``since_timestamp`` selects."""
    since = dict(since_version=data.since_version, since_timestamp=data.since_timestamp)
    snapshot = open_table(
        table, version, timestamp, data.trust_petastorm_metadata, **(since if changes else {})
    )
    if data.filters:
        snapshot = select(snapshot, parse_filters(data.filters, snapshot.schema))
    if data.cache_dir:
        snapshot = cache_files(snapshot, data.cache_dir, data.cache_dir_max_bytes)
    return snapshot


def _full_eval_snapshot(data: DataConfig, changes: TableSnapshot, evals: dict):
    """The gate's evaluation split (test, else validation) over the whole table at the
    version of the change snapshot ``changes``; None when that split has its own table."""
    for name, table, value in (
        ("test", data.test_table, data.test_split),
        ("validation", data.validation_table, data.validation_split),
    ):
        if evals[name] is None:
            continue
        if table:
            return None
        whole = _open(data, data.table, changes.version)
        snap = _split(whole, data, value, f"data.{name}_split")
        return snap if snap is not None and snap.files else None
    return None


def _split(snapshot: TableSnapshot, data: DataConfig, value: str, key: str):
    if not data.split_column:
        return snapshot if key == "data.train_split" else None
    if not value:
        return None
    if data.split_column not in snapshot.schema.names:
        raise DataError(
            f"data.split_column={data.split_column!r} is not a column of table "
            f"{snapshot.uri!r}. Its columns: {', '.join(snapshot.schema.names)}."
        )
    return select(snapshot, [(data.split_column, "=", value)])


def _partition_values(snapshot: TableSnapshot, column: str | None) -> str:
    if not column or column not in snapshot.partition_columns:
        return "n/a"
    return ", ".join(sorted({p.get(column, "") for p in snapshot.partitions})) or "none"
