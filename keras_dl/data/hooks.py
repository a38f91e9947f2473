"""The data path's inner parts, named here as deliberate hooks for the benchmarks and tests.

The benchmarks (``benchmarks/``, beside the package) time the stages of the read on their own
and plan epochs without reading them. They import these names from here, never the modules of
:mod:`keras_dl.data.stream` or :mod:`keras_dl.data.tables` themselves, so those stay free to
change: a rename there changes this module, not the benchmarks. A benchmark that measures or
replaces a stage passes its own through the constructors' arguments (``make_dataset(...,
stream=)``, ``EpochStream(..., reads=)``, ``read_pieces(..., load=)``): nothing is patched.
"""

from __future__ import annotations

from keras_dl.data.ingest.spark_delta import file_stats
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
    "guard_generator",
    "is_packed",
    "load_and_convert",
    "pack",
    "parse_filters",
    "plan_epoch",
    "plan_pieces",
    "read_pieces",
    "row_group_loader",
    "row_ids_to_bytes",
    "rows_per_gather",
    "scan_table",
    "shard_sizes",
]
