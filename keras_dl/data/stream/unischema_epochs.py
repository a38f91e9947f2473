"""A Petastorm dataset (a Unischema with codecs), read row-exact per shard by ``make_reader``.

Petastorm's row reader decodes the codecs; its rows are stacked into ``{column: array}`` chunks
of ``CHUNK_ROWS``. Tables (Delta, Parquet) are read by :mod:`keras_dl.data.stream.shard_epochs` instead.
"""

from __future__ import annotations

import warnings

import numpy as np

from keras_dl.data.stream import shutdown
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.packing import pack
from keras_dl.data.stream.shards import keep_mask, plan_epoch
from keras_dl.errors import DataError
from keras_dl.storage import file_url

CHUNK_ROWS = 256  # decoded rows stacked per chunk handed to tf.data
_RESULTS_QUEUE = 4  # row groups Petastorm's pool holds decoded ahead of the reader


def iter_unischema_rows(snapshot, plan, stats, shard, num_shards, shuffle, seed, workers):
    """A Petastorm (Unischema) dataset's rows of this shard, decoded by ``make_reader``.

    ``make_reader`` cannot be handed row groups in an order, so every shard reads the whole
    dataset in one seeded order (the same on every shard) and keeps the positions of its run,
    as planned for a table of one file: exact, at the cost of every shard decoding every row.
    """
    from petastorm import make_reader

    from keras_dl.data import petastorm_compat
    from keras_dl.data.tables.petastorm_meta import known_unischema

    petastorm_compat.install()  # Petastorm's own metadata unpickling is patched too
    if stats.rows == 0:
        return
    stats.check_shards(num_shards, snapshot.uri)
    runs = plan_epoch([stats.rows], shard, num_shards, shuffle=shuffle, seed=seed).files
    keep = keep_mask(runs[0][1], stats.rows) if runs else np.zeros(stats.rows, bool)
    expected = int(keep.sum())
    # make_reader would unpickle the Unischema again: hand it the one open_petastorm vetted.
    shutdown.check_open()  # lifecycle: no reader opens once the interpreter is exiting
    with warnings.catch_warnings(), known_unischema(snapshot.uri, snapshot.unischema):
        warnings.simplefilter("ignore")
        reader = make_reader(
            file_url(snapshot.uri),
            schema_fields=plan.columns,
            reader_pool_type="thread",
            workers_count=workers,
            results_queue_size=_RESULTS_QUEUE,
            num_epochs=1,
            shuffle_row_groups=shuffle,
            seed=seed if shuffle else None,
        )
    shutdown.track(reader)  # lifecycle: stopped at exit
    read = position = 0
    try:
        rows = []
        for row in reader:
            shutdown.check_open()  # lifecycle: at exit, stop between rows
            if position < len(keep) and keep[position]:
                rows.append(row)
            position += 1
            if len(rows) == CHUNK_ROWS:
                read += len(rows)
                yield _stack(rows, plan)
                rows = []
        if rows:
            read += len(rows)
            yield _stack(rows, plan)
    except (DataError, shutdown.ReadersClosed):  # lifecycle: not a read error
        raise
    except Exception as exc:
        raise DataError(f"Reading Petastorm dataset {snapshot.uri!r} failed: {exc}") from exc
    finally:
        reader.stop()
        reader.join()
    if read != expected or position != stats.rows:
        raise DataError(
            f"Reading Petastorm dataset {snapshot.uri!r} (shard {shard} of {num_shards}) "
            f"returned {position} rows ({read} of this shard) where its row groups hold "
            f"{stats.rows} ({expected} of this shard). Retry; if it persists, report it with "
            "the dataset."
        )


def _stack(rows, plan: ColumnPlan) -> dict[str, np.ndarray]:
    out = {}
    for name in plan.columns:
        values = [getattr(r, name) for r in rows]
        out[name] = np.stack(values) if np.ndim(values[0]) else np.asarray(values)
    return pack(out, plan)
