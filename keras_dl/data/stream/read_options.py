"""How one split is read (:class:`ReadOptions`), and the steps an epoch runs on every shard."""

from __future__ import annotations

import math
from dataclasses import dataclass

from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.tables.stats import TableStats
from keras_dl.errors import DataError

# data.io_concurrency and data.io_max_bytes' defaults (keras_dl.config.schema.DataConfig).
IO_CONCURRENCY = 16
IO_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class IoOptions:
    """How a reader fetches row groups from an object store, ahead of its decoding workers
    (:mod:`keras_dl.data.stream.prefetch`).

    Args:
        concurrency: Range requests in flight at once; 0 turns fetching ahead off (each
            worker opens the file and reads its row group itself). Defaults to 16.
        max_bytes: Bytes requested and not yet decoded, at most (a larger row group is
            fetched alone). Defaults to 67108864 (64 MiB).
    """

    concurrency: int = IO_CONCURRENCY
    max_bytes: int = IO_MAX_BYTES


@dataclass(frozen=True)
class ReadOptions:
    """How one split is read.

    Args:
        batch_size: Rows per batch yielded by the dataset (per replica / per rank).
        training: Repeat forever and shuffle. Defaults to False.
        shard: This reader's shard (the rank). Defaults to 0.
        num_shards: Number of shards (the world size). Defaults to 1.
        shuffle: Shuffle the rows, when training. Defaults to True.
        shuffle_buffer: Rows mixed in memory. Defaults to 4096.
        seed: Shuffle seed. Defaults to 42.
        workers: Petastorm reader threads. Defaults to 2.
        cache_max_bytes: Keep the split's decoded rows in memory after its first read when
            they fit in this many bytes (:mod:`keras_dl.data.stream.memory_cache`). Defaults to 0
            (every epoch is read from the table).
        pad: Training: yield sample weights and pad each epoch to whole batches with
            zero-weight rows, even with one shard (several shards always do). Defaults to False.
        io_concurrency: Range requests in flight at once when reading from an object store
            (:class:`IoOptions`); 0: none ahead of the workers. Defaults to 16.
        io_max_bytes: Bytes fetched ahead and not yet decoded, at most. Defaults to 64 MiB.
    """

    batch_size: int
    training: bool = False
    shard: int = 0
    num_shards: int = 1
    shuffle: bool = True
    shuffle_buffer: int = 4096
    seed: int = 42
    workers: int = 2
    cache_max_bytes: int = 0
    pad: bool = False
    io_concurrency: int = IO_CONCURRENCY
    io_max_bytes: int = IO_MAX_BYTES

    @property
    def io(self) -> IoOptions:
        """How row groups are fetched from an object store."""
        return IoOptions(self.io_concurrency, self.io_max_bytes)


def steps_per_epoch(snapshot: TableSnapshot, stats: TableStats, options: ReadOptions) -> int:
    """Batches per epoch: the largest shard's rows in batches, so every shard runs as many."""
    where = f"Table {snapshot.uri!r} (version {snapshot.version})"
    if stats.rows == 0:
        raise DataError(
            f"{where} has no rows"
            f"{' matching ' + str(list(snapshot.row_filters)) if snapshot.row_filters else ''}. "
            "Write data to it, or check data.split_column, data.filters and the split names."
        )
    stats.check_shards(options.num_shards, snapshot.uri)
    largest = stats.shard_rows(0, options.num_shards)
    return math.ceil(largest / options.batch_size)
