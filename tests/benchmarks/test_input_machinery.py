"""The bench's reader-machinery comparison and per-thread CPU split (benchmarks.input_machinery)."""

import numpy as np
import pytest

from benchmarks import input_machinery as machinery
from benchmarks import timing
from benchmarks.input_tables import write_wide


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return write_wide(str(tmp_path_factory.mktemp("wide") / "wide"), 900, 128, label=True)


def _pieces_and_convert(path, shard, num_shards):
    from keras_dl.data import ReadOptions, open_table, plan_columns
    from keras_dl.data.stream.arrays import to_arrays
    from keras_dl.data.stream.epoch_stream import EpochStream

    snapshot = open_table(path)
    plan = plan_columns(snapshot, (), "label", pack=True)
    options = ReadOptions(16, training=True, shard=shard, num_shards=num_shards)
    pieces = EpochStream(snapshot, plan, options).pieces(3)

    def convert(table, file, row_group):
        return to_arrays(table, plan, snapshot)

    return snapshot, plan, pieces, convert


@pytest.mark.parametrize("shard", [0, 1])
def test_the_plain_pool_hands_on_what_petastorm_s_reader_does_in_the_same_order(wide, shard):
    from keras_dl.data.stream.shard_epochs import read_pieces

    snapshot, plan, pieces, convert = _pieces_and_convert(wide, shard, 2)
    assert any(p.keep is not None for p in pieces)  # boundary row groups, masked to the shard
    calls = {"petastorm": 0, "plain": 0}
    got = {}
    for name, read in (("petastorm", read_pieces), ("plain", machinery.plain_reads)):

        def near_end(name=name):
            calls[name] += 1

        got[name] = list(
            read(snapshot, plan.columns, pieces, 2, convert=convert, near_end=near_end)
        )
    assert [p for p, _ in got["plain"]] == [p for p, _ in got["petastorm"]] == list(pieces)
    for (_, a), (_, b) in zip(got["plain"], got["petastorm"]):
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert calls == {"petastorm": 1, "plain": 1}


def test_a_plain_pool_error_is_raised_in_the_order_of_the_reads(wide):
    snapshot, plan, pieces, _ = _pieces_and_convert(wide, 0, 1)

    def convert(table, file, row_group):
        if (file, row_group) == (pieces[2].file, pieces[2].row_group):
            raise ValueError("bad row group")
        return table.num_rows

    read = machinery.plain_reads(snapshot, plan.columns, pieces, 2, convert=convert)
    assert [next(read)[1] for _ in range(2)] == [p.rows for p in pieces[:2]]
    with pytest.raises(ValueError, match="bad row group"):
        next(read)


def test_the_thread_split_adds_up_to_the_process_cpu_and_restores_what_it_timed(wide, monkeypatch):
    from keras_dl.data.stream import epoch_stream, row_group_worker
    from keras_dl.data.stream.epoch_stream import EpochStream

    originals = (row_group_worker.load_and_convert, EpochStream.generate, epoch_stream.read_pieces)
    monkeypatch.setattr(timing, "MIN_SECONDS", 0.3)
    threads = machinery.thread_cpu(wide, 32, pack=True)
    parts = threads["cpu_us_per_row"]
    assert parts["reader_workers_load_and_convert"] > 0
    assert parts["generator_shuffle_and_blocks"] > 0
    assert abs(sum(parts.values()) - threads["cpu_us_per_row_total"]) < 0.01
    assert threads["rows_per_s"] > 0 and threads["busy_cores"] > 0
    both = machinery.reader_machinery(wide, 32, rounds=1, pack=True)
    assert set(both["rows_per_s"]) == {"petastorm_reader", "plain_thread_pool"}
    assert (
        row_group_worker.load_and_convert,
        EpochStream.generate,
        epoch_stream.read_pieces,
    ) == originals
