"""
Title: tabular, a feed-forward network for any Delta or Parquet table
Description: point it at a table and a label column; it reads the schema and builds the model.

Train on a table it has never seen, with no code::

    python -m recipes.tabular --set data.table=data/houses --set data.label=price
    python -m recipes.tabular --set data.table=data/churn --set data.label=churned \\
        --set data.split_column=split --set data.features=age,plan,monthly_fee

What it infers from the schema:

- **Features**: every column but the label (and the split column), or ``data.features``.
  Numeric columns (ints, floats, bools, fixed-length lists of numbers) go through a
  ``Normalization`` layer fitted on the training rows; string columns go through a
  ``StringLookup`` fitted on their most frequent values (one-hot, or an embedding when there are
  many). Both layers live *inside* the model, so the registered model takes raw columns.
  A float column whose training rows hold NaN gets its training mean in their place and a 0/1
  "was missing" input beside it (``recipes/_tabular_numbers.py``).
- **Network**: hidden layers (``model.hidden``, 64 and 32 units, dropout 0.3) and a linear
  path beside them: the output layer sees the encoded columns too (``model.linear``), so a
  linear model of the columns, scikit-learn's simple baseline, is one the network can fit.
  The numeric columns of one dtype are read and fed as one tensor (``data.pack_features``,
  on here); the registered model still takes each column by name.
- **Task**: a string, boolean or integer label means classification (softmax over the label's
  classes, accuracy); a float label means regression (mean squared error, MAE and RMSE).
  ``--set model.task=regression`` overrides it, e.g. for an integer count.
- **Several labels** (``--set data.label=price,churned``): one output head per label, named
  after it, each with its own task, loss and metrics (``val_price_mae``,
  ``val_churned_accuracy``); the heads share the hidden layers, the losses are summed, and
  ``data.weight_column`` weighs every head. ``model.task`` other than "auto" applies to every
  head.
- **Batch size, epochs and early stopping**: from the training rows ``R``, unless you set them
  (:mod:`keras_dl.model.sizing`): ``train.batch_size`` = R/16 rounded to a power of two within 8..256;
  ``train.epochs`` = enough for about 3,000 steps, within 10..300; and with a validation split,
  early stopping on ``callbacks.monitor`` (val_loss) with ``callbacks.patience`` = epochs/10
  within 5..20 and ``restore_best_weights``. The chosen values are printed, written to
  ``config.yaml`` and logged as params. ``--set train.batch_size=64 --set train.epochs=20``
  trains exactly that (and sets no early stopping).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keras_dl.config import DataConfig, Experiment, TrainConfig, bounded
from keras_dl.data.stream.features import NUMERIC, STRING
from keras_dl.data.stream.packing import input_name
from keras_dl.data.tables import open_table
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import ConfigError, DataError
from keras_dl.model.pyfunc import IMPUTE_ATTRIBUTE
from keras_dl.model.sizing import fill_in_sizes
from keras_dl.recipe import Recipe
from recipes import _examples
from recipes._tabular_labels import (
    Target,
    compile_options,
    encode_labels,
    make_head,
    make_label_table,
    make_target,
)
from recipes._tabular_numbers import encode_numbers

log = logging.getLogger(__name__)
Task = Literal["auto", "classification", "regression"]
TASKS = get_args(Task)

# ## Defaults


@dataclass(frozen=True)
class TabularModel:
    """The network and how it reads the table.

    Args:
        task: "auto" (from the label's type), "classification" or "regression".
            Defaults to "auto".
        hidden: Units of each hidden dense layer. Defaults to (64, 32).
        dropout: Dropout after each hidden layer. Defaults to 0.3 (with the linear path, it
            keeps the hidden layers from fitting noise the linear part does not).
        max_vocabulary: Most frequent values kept per string column; the rest share one
            out-of-vocabulary slot. Defaults to 1000.
        embed_above: String columns with more values than this are embedded instead of
            one-hot encoded. Defaults to 32.
        embedding_dim: Size of those embeddings. Defaults to 8.
        stats_rows: Training rows read to fit the normalization and vocabularies.
            Defaults to 100000.
        linear: Whether the output layer also sees the encoded columns themselves (a
            linear path beside the hidden layers, "wide and deep"), so a linear model of the
            columns is one the network can fit. Defaults to True.
        optional: Feature columns that may be null or NaN when the model scores: a missing
            value is filled with the column's training mean (numeric) or most frequent value
            (string), computed on the same rows. Any other column's missing value is refused.
            Defaults to none.
    """

    # Each choice and range is checked when the config is resolved, before any run starts.
    task: Task = "auto"
    hidden: tuple[int, ...] = bounded((64, 32), 1)
    dropout: float = bounded(0.3, 0, 1, high_open=True)
    max_vocabulary: int = bounded(1000, 1)
    embed_above: int = bounded(32, 0)
    embedding_dim: int = bounded(8, 1)
    stats_rows: int = bounded(100_000, 1)
    optional: tuple[str, ...] = ()
    linear: bool = True


DEFAULTS = Experiment(
    recipe="tabular",
    # The numeric columns of one dtype travel as one tensor (the logged model takes them named).
    data=DataConfig(table="", label="label", pack_features=True),
    # Null: chosen from the training table's row count (keras_dl.model.sizing) unless set.
    # 3e-3: 1e-3 reached the epoch ceiling still improving on a 600-row regression.
    train=TrainConfig(epochs=None, batch_size=None, learning_rate=3e-3),
    model=TabularModel(),
)


# ## Reading the labels: classification or regression (recipes/_tabular_labels.py)


def prepare(exp: Experiment) -> Recipe:
    """Read the label column of the whole table and specialise the recipe to it.

    The classes come from every row (all splits), so a validation row never holds a class the
    model has no output for.
    """
    m: TabularModel = exp.model
    if m.task not in TASKS:
        raise ConfigError(f"model.task={m.task!r} is not one of {', '.join(TASKS)}.")
    snapshot = open_table(exp.data.table, exp.data.version, exp.data.timestamp)
    labels = exp.data.labels
    for label in labels:
        if label not in snapshot.schema.names:
            raise DataError(
                f"Label column {label!r} is not in table {snapshot.uri!r}. Its columns: "
                f"{', '.join(snapshot.schema.names)}. Set data.label to one of them."
            )
    targets = {
        label: make_target(
            _read_column(snapshot, label), snapshot.schema.field(label).type, m.task, label
        )
        for label in labels
    }
    names = list(exp.data.features) or [
        n
        for n in snapshot.schema.names
        if n not in {*labels, exp.data.split_column, *snapshot.partition_columns}
    ]
    unknown = [c for c in m.optional if c not in names]
    if unknown:
        raise ConfigError(
            f"model.optional names {', '.join(map(repr, unknown))}, not a feature of table "
            f"{snapshot.uri!r}. Its features: {', '.join(names)}. Name feature columns only."
        )
    single = names[0] if len(names) == 1 else None
    tables = {label: make_label_table(t) for label, t in targets.items()}
    preprocess = partial(encode_labels, tables, single)
    target = targets if len(labels) > 1 else targets[labels[0]]
    return dataclasses.replace(
        RECIPE,
        build_model=partial(build_model, target=target),
        compile_options=partial(compile_options, target=target),
        preprocess=preprocess,
        prepare=None,
    )


# ## The model


def build_model(data, exp: Experiment, target: Target | dict[str, Target] | None = None):
    """One input per column, each normalized or looked up inside the model, then an MLP, and
    one output (or, for several labels, one output per label, keyed by it).

    Packed features (``data.pack_features``, on here by default) are one ``(k,)`` input each,
    normalized with each column's own mean and variance: the same function as k inputs. The
    logged model takes the named columns (:func:`keras_dl.model.log.serving_model`)."""
    import keras
    from keras import layers

    if target is None:
        raise ConfigError(
            "The tabular recipe is trained through keras_dl.train.fit (it calls prepare)."
        )
    m: TabularModel = exp.model
    read = [_Col(c) for spec in data.plan.features for c in spec.columns]
    columns = _read_features(data.snapshot, read, m.stats_rows)
    inputs, encoded, impute = {}, [], {}
    for spec in data.plan.features:
        if spec.members:  # packed: (rows, k), normalized column by column as if apart
            values = np.stack([columns[c] for c in spec.members], axis=1)
        else:
            values = columns[spec.name]
        if spec.kind == STRING:
            inp = keras.Input(shape=(), dtype="string", name=input_name(spec.name))
            vocab = _vocabulary(values, m.max_vocabulary)
            if spec.name in m.optional and vocab:
                impute[spec.name] = vocab[0]  # the most frequent value
            if len(vocab) + 1 <= m.embed_above:
                x = layers.StringLookup(vocabulary=vocab, output_mode="one_hot")(inp)
            else:
                x = layers.StringLookup(vocabulary=vocab)(inp)
                x = layers.Embedding(len(vocab) + 1, m.embedding_dim)(x)
        else:
            inp = keras.Input(shape=spec.shape, dtype=spec.dtype, name=input_name(spec.name))
            x = layers.Reshape((int(np.prod(spec.shape)),))(keras.ops.cast(inp, "float32"))
            flat = values.reshape(len(values), -1).astype(np.float64)
            for j, column in enumerate(spec.members):  # imputed by name, before packing
                if column in m.optional:
                    impute[column] = float(np.nanmean(flat[:, j]))
            if spec.name in m.optional:
                mean = np.nanmean(flat, 0)
                impute[spec.name] = mean.tolist() if spec.shape else float(mean[0])
            inputs[spec.name] = inp
            encoded.extend(encode_numbers(x, flat))  # normalized; NaN filled and flagged
            continue
        inputs[spec.name] = inp
        encoded.append(x)
    x = features = layers.Concatenate()(encoded) if len(encoded) > 1 else encoded[0]
    for units in m.hidden:
        x = layers.Dense(units, activation="relu")(x)
        x = layers.Dropout(m.dropout)(x)
    if m.linear and m.hidden:  # the heads also see the encoded columns: a linear fit too
        x = layers.Concatenate()([features, x])
    if isinstance(target, dict):
        outputs = {k: make_head(x, t, input_name(k)) for k, t in target.items()}
    else:
        outputs = make_head(x, target)
    with warnings.catch_warnings():
        # Inputs are keyed by column name; a name Keras refuses for a layer ("/") keeps its
        # column as the key and Keras warns that key and layer name differ. That is the intent.
        warnings.filterwarnings("ignore", message="When providing `inputs` as a dict")
        model = keras.Model(inputs, outputs, name="tabular_mlp")
    setattr(model, IMPUTE_ATTRIBUTE, impute)  # logged with the model (keras_dl.json)
    return model


RECIPE = Recipe(
    name="tabular",
    description="MLP for any Delta/Parquet table: numeric + string features, classification or regression",
    defaults=DEFAULTS,
    build_model=build_model,
    accept=(NUMERIC, STRING),
    prepare=prepare,
    configure=fill_in_sizes,
    heads=True,
    example=_examples.tabular,  # a small table it trains on, made offline
)


# ## Helpers


def _read_column(snapshot: TableSnapshot, column: str) -> np.ndarray:
    return _read_features(snapshot, [_Col(column)], rows=None)[column]


@dataclass(frozen=True)
class _Col:
    name: str


def _read_features(snapshot: TableSnapshot, specs, rows: int | None) -> dict[str, np.ndarray]:
    """The first ``rows`` rows (all when None) of some columns, as training reads them:
    deleted rows dropped, row filters applied, partition columns typed."""
    from keras_dl.data.stream.shard_epochs import iter_epoch
    from keras_dl.data.tables.stats import scan_table

    names = list(dict.fromkeys(s.name for s in specs))
    chunks: dict[str, list] = {n: [] for n in names}
    seen = 0
    for table in iter_epoch(snapshot, names, scan_table(snapshot), shuffle=False, seed=None):
        for n in names:
            chunks[n].append(_to_numpy(table.column(n)))
        seen += table.num_rows
        if rows is not None and seen >= rows:
            break
    return {n: np.concatenate(v)[:rows] if v else np.array([]) for n, v in chunks.items()}


def _to_numpy(chunked: pa.ChunkedArray) -> np.ndarray:
    col = chunked.combine_chunks()  # pyarrow 12: only Array.to_numpy takes zero_copy_only
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return np.stack(col.to_numpy(zero_copy_only=False)) if len(col) else np.zeros((0, 1))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)
    return col.to_numpy(zero_copy_only=False)  # booleans are bit-packed: not zero-copy


def _vocabulary(values: np.ndarray, limit: int) -> list[str]:
    """The ``limit`` most frequent values, most frequent first (ties by value, deterministic)."""
    counts = pc.value_counts(pa.array(values.tolist(), pa.string()))
    pairs = sorted(((-c.as_py(), v.as_py()) for v, c in zip(counts.field(0), counts.field(1))))
    return [v for _, v in pairs[:limit] if v is not None]


# ## Run it

if __name__ == "__main__":
    from keras_dl.cli import run_recipe

    raise SystemExit(run_recipe("tabular"))
