"""Batch size, epochs and early stopping chosen from the training table's row count.

A recipe whose defaults leave ``train.batch_size`` and ``train.epochs`` null uses
:func:`fill_in_sizes` as its ``configure`` hook (the tabular recipe does). The rule, for ``R``
training rows (after the split column and ``data.filters``):

- ``batch_size`` = R / 16 rounded to the nearest power of two, within 8..256 (about 16 steps an
  epoch), then rounded up to a multiple of the processes (Horovod ranks, multi-worker workers);
- ``epochs`` = enough epochs for about 3,000 steps, within 10..300;
- when ``epochs`` is chosen and there is a validation split, early stopping too:
  ``callbacks.patience`` = epochs / 10 within 5..20 (unless set), on ``callbacks.monitor``
  (val_loss by default), with ``callbacks.restore_best_weights``. Auto epochs are a ceiling that
  early stopping cuts short. Without a validation split every chosen epoch is trained.

A value set by the user (``--set``, YAML, or in Python) is kept; only nulls are filled in, so
filling in twice changes nothing. What was chosen is printed, and, being the experiment's values,
it is written to ``config.yaml`` and logged as MLflow params like any setting.

Example:
    >>> choose_sizes(150, validation=True)
    Sizing(rows=150, batch_size=8, epochs=158, patience=15, restore_best_weights=True)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from keras_dl.config import DataConfig, Experiment

ROWS_PER_BATCH = 16
MIN_BATCH, MAX_BATCH = 8, 256
TARGET_STEPS = 3000
MIN_EPOCHS, MAX_EPOCHS = 10, 300
MIN_PATIENCE, MAX_PATIENCE = 5, 20


@dataclass(frozen=True)
class Sizing:
    """What :func:`choose_sizes` chose (``patience`` None: no early stopping was chosen)."""

    rows: int
    batch_size: int
    epochs: int
    patience: int | None
    restore_best_weights: bool


def choose_sizes(
    rows: int,
    validation: bool,
    batch_size: int | None = None,
    epochs: int | None = None,
    patience: int | None = None,
    processes: int = 1,
) -> Sizing:
    """The module's rule for ``rows`` training rows; given values are kept as they are.

    Args:
        rows: Training rows.
        validation: Whether a validation split exists (early stopping needs one).
        batch_size: The user's batch size, or None to choose it. Defaults to None.
        epochs: The user's epochs, or None to choose them. Defaults to None.
        patience: The user's ``callbacks.patience``, or None. Defaults to None.
        processes: Processes the global batch is split over. Defaults to 1.
    """
    if batch_size is None:
        ideal = max(rows, 1) / ROWS_PER_BATCH
        batch_size = min(MAX_BATCH, max(MIN_BATCH, 2 ** round(math.log2(ideal))))
        batch_size = math.ceil(batch_size / processes) * processes
    restore = False
    if epochs is None:
        steps = max(1, math.ceil(rows / batch_size))
        epochs = min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(TARGET_STEPS / steps)))
        if validation and patience is None:
            patience = min(MAX_PATIENCE, max(MIN_PATIENCE, epochs // 10))
            restore = True
    return Sizing(rows, batch_size, epochs, patience, restore)


def fill_in_sizes(exp: Experiment) -> Experiment:
    """``exp`` with a null ``train.batch_size`` / ``train.epochs`` chosen from the row count.

    A recipe's ``configure`` hook (see :func:`keras_dl.recipe.configure`). Reads only the
    tables' footers (and the split column when it is not a partition column).
    """
    t, c = exp.train, exp.callbacks
    if t.batch_size is not None and t.epochs is not None:
        return exp
    train_rows, validation_rows = count_split_rows(exp.data)
    size = choose_sizes(
        train_rows,
        validation=validation_rows > 0,
        batch_size=t.batch_size,
        epochs=t.epochs,
        patience=c.patience,
        processes=_processes(exp),
    )
    train = dataclasses.replace(t, batch_size=size.batch_size, epochs=size.epochs)
    callbacks = dataclasses.replace(
        c,
        patience=size.patience,
        restore_best_weights=c.restore_best_weights or size.restore_best_weights,
    )
    from keras_dl.distribute.world import current_world

    if current_world().is_chief:
        print(describe(exp, size, t.batch_size is None, t.epochs is None, c.patience is None))
    return dataclasses.replace(exp, train=train, callbacks=callbacks)


def count_split_rows(data: DataConfig) -> tuple[int, int]:
    """Rows of the training split and of the validation split (0 when there is none), with
    ``data.filters`` applied, counted as training reads them (deleted rows left out)."""
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.filters import parse_filters, select
    from keras_dl.data.tables.stats import scan_table

    def opened(table, version=None, timestamp=None, **since):
        snapshot = open_table(table, version, timestamp, data.trust_petastorm_metadata, **since)
        if data.filters:
            snapshot = select(snapshot, parse_filters(data.filters, snapshot.schema))
        return snapshot

    def rows(snapshot, value):
        if data.split_column and data.split_column in snapshot.schema.names:
            snapshot = select(snapshot, [(data.split_column, "=", value)])
        return scan_table(snapshot).rows

    table = opened(
        data.table,
        data.version,
        data.timestamp,
        since_version=data.since_version,
        since_timestamp=data.since_timestamp,
    )
    train = rows(table, data.train_split) if data.split_column else scan_table(table).rows
    if data.validation_table:
        validation = scan_table(opened(data.validation_table)).rows
    elif data.split_column and data.validation_split:
        validation = rows(table, data.validation_split)
    else:
        validation = 0
    return train, validation


def describe(exp: Experiment, size: Sizing, batch: bool, epochs: bool, patience: bool) -> str:
    """One line saying what was chosen from the row count, and how to override it."""
    chosen = []
    if batch:
        chosen.append(f"train.batch_size={size.batch_size}")
    if epochs:
        steps = size.epochs * math.ceil(size.rows / size.batch_size)
        chosen.append(f"train.epochs={size.epochs} (at most {steps} steps)")
    if epochs and patience and size.patience is not None:
        chosen.append(
            f"early stopping on {exp.callbacks.monitor} with callbacks.patience={size.patience} "
            "and restore_best_weights"
        )
    elif epochs and size.patience is None:
        chosen.append("no early stopping (no validation split)")
    return (
        f"{exp.recipe or 'keras-dl'}: {size.rows} training rows: chose {', '.join(chosen)}. "
        "Set them (--set KEY=VALUE) to override."
    )


def _processes(exp: Experiment) -> int:
    """Processes the global batch is split over: the ranks or workers ``runtime.np`` launches
    (Horovod's or the multi-worker strategy's), or this world's size."""
    if exp.runtime.launches:
        return abs(exp.runtime.np)
    from keras_dl.distribute.world import current_world

    return current_world().size
