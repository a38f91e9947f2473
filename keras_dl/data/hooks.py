"""The data path's inner parts, named here as deliberate hooks for the benchmarks and tests.

The benchmarks (``benchmarks/``, beside the package) time the stages of the read on their own
and plan epochs without reading them. They import these names from here, never the modules of
:mod:`keras_dl.data.stream` or :mod:`keras_dl.data.tables` themselves, so those stay free to
change: a rename there changes this module, not the benchmarks. The context managers swap one
stage for a measured one and always put the original back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from keras_dl.data.ingest.spark_delta import file_stats
from keras_dl.data.stream import epoch_stream, row_group_worker
from keras_dl.data.stream.blocks import rows_per_gather
from keras_dl.data.stream.epoch_position import EpochPosition, EpochRows, Layout, Segment
from keras_dl.data.stream.epoch_stream import EpochStream
from keras_dl.data.stream.features import PACKED
from keras_dl.data.stream.packing import is_packed, pack
from keras_dl.data.stream.row_group_worker import Converted, load_and_convert, row_group_loader
from keras_dl.data.stream.row_ranges import count as count_row_ids
from keras_dl.data.stream.row_ranges import to_bytes as row_ids_to_bytes
from keras_dl.data.stream.shard_epochs import epoch_pieces, read_pieces
from keras_dl.data.stream.shards import plan_epoch, plan_pieces, shard_sizes
from keras_dl.data.stream.shutdown import guard_generator
from keras_dl.data.tables.chunks import FileChunks
from keras_dl.data.tables.filters import parse_filters
from keras_dl.data.tables.stats import count_rows, scan_table

__all__ = [
    "PACKED",
    "Converted",
    "FileChunks",
    "EpochPosition",
    "EpochRows",
    "EpochStream",
    "Layout",
    "Segment",
    "count_row_ids",
    "count_rows",
    "epoch_pieces",
    "file_stats",
    "generate_wrapped",
    "guard_generator",
    "is_packed",
    "load_and_convert",
    "loads_wrapped",
    "pack",
    "parse_filters",
    "plan_epoch",
    "plan_pieces",
    "read_pieces",
    "reads_replaced",
    "row_group_loader",
    "row_ids_to_bytes",
    "rows_per_gather",
    "scan_table",
    "shard_sizes",
]


@contextlib.contextmanager
def reads_replaced(reads: Callable) -> Iterator[None]:
    """Within the block, epoch streams made read their row groups with ``reads`` (same
    signature as :func:`read_pieces`) instead of Petastorm's reader."""
    saved = epoch_stream.read_pieces
    epoch_stream.read_pieces = reads
    try:
        yield
    finally:
        epoch_stream.read_pieces = saved


@contextlib.contextmanager
def loads_wrapped(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Within the block, the reader workers load and convert row groups with
    ``wrap(load_and_convert)``."""
    saved = row_group_worker.load_and_convert
    row_group_worker.load_and_convert = wrap(saved)
    try:
        yield
    finally:
        row_group_worker.load_and_convert = saved


@contextlib.contextmanager
def generate_wrapped(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Within the block, :meth:`EpochStream.generate` is ``wrap(EpochStream.generate)``."""
    saved = EpochStream.generate
    EpochStream.generate = wrap(saved)
    try:
        yield
    finally:
        EpochStream.generate = saved
