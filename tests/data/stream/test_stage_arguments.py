"""The read's stages passed in as arguments, as the benchmarks pass them: the split runs the
stream ``make_dataset`` is given, the stream reads through its ``reads``, and the reader's
workers hand each row group on through ``read_pieces``' ``load``."""

import functools
import threading

import numpy as np
import pyarrow as pa

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns
from keras_dl.data.stream.epoch_stream import EpochStream
from keras_dl.data.stream.row_group_worker import Converted, load_and_convert
from keras_dl.data.stream.shard_epochs import read_pieces
from tests.conftest import write_test_table


def _split(path):
    """A table of 300 rows in row groups of 50 (``f``: the row's number), and its plan."""
    table = pa.table({"f": np.arange(300, dtype=np.float32), "label": np.arange(300) % 3})
    write_test_table(path, table, 50)
    snap = open_table(path)
    return snap, plan_columns(snap, ("f",), "label")


def _rows(split):
    return np.concatenate([x.numpy() for x, _ in split.dataset])


def test_a_stream_given_reads_asks_it_for_the_epoch_s_pieces_and_yields_the_rows_it_returned(
    tmp_path,
):
    snap, plan = _split(str(tmp_path / "t"))
    asked = []

    def reads(snapshot, columns, pieces, *args, **kwargs):
        asked.append(list(pieces))
        for piece, arrays in read_pieces(snapshot, columns, pieces, *args, **kwargs):
            yield piece, {**arrays, "f": arrays["f"] + 1000}  # rows the table does not hold

    options = ReadOptions(32)  # evaluation: one epoch, every row once, in the read's order
    split = make_dataset(snap, plan, options, stream=functools.partial(EpochStream, reads=reads))
    rows = _rows(split)
    assert isinstance(split.stream, EpochStream)
    assert asked == [list(split.stream.pieces(0))] and len(asked[0]) == 6
    np.testing.assert_array_equal(rows, _rows(make_dataset(snap, plan, options)) + 1000)
    np.testing.assert_array_equal(np.sort(rows), np.arange(300) + 1000)


def test_read_pieces_hands_each_row_group_on_through_load_on_the_reader_s_workers(tmp_path):
    snap, plan = _split(str(tmp_path / "t"))
    pieces = EpochStream(snap, plan, ReadOptions(32)).pieces(0)
    calls = []

    def load(loader, convert, index, row_group):
        calls.append(((index, row_group), threading.get_ident()))
        table = load_and_convert(loader, convert, index, row_group)  # no convert: the table
        return Converted(table.num_rows, ("loaded", index, row_group))

    got = list(read_pieces(snap, plan.columns, pieces, 2, load=load))
    assert got == [(p, ("loaded", p.file, p.row_group)) for p in pieces]
    assert sorted(key for key, _ in calls) == sorted((p.file, p.row_group) for p in pieces)
    assert threading.get_ident() not in {thread for _, thread in calls}
    # Without it, the workers hand on the row groups' tables themselves.
    tables = list(read_pieces(snap, plan.columns, pieces, 2))
    assert [p for p, _ in tables] == list(pieces)
    assert all(isinstance(t, pa.Table) and t.num_rows == p.rows for p, t in tables)
