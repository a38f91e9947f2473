"""data.cache=auto: small splits are read once, then replayed from memory, exactly and reshuffled."""

import numpy as np
import pyarrow as pa

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns
from keras_dl.data.stream import epoch_stream
from keras_dl.data.stream.memory_cache import EpochCache, chunk_bytes
from keras_dl.data.stream.shards import Piece
from tests.conftest import write_test_table


def _chunks(keep=None):
    """A fake split of 6 row groups of 10 rows, as ``(piece, arrays)``."""
    for i in range(6):
        yield (
            Piece(i // 3, i % 3, keep, 10),
            {"x": np.arange(10 * i, 10 * i + 10, dtype=np.float32)},
        )


def test_a_whole_split_is_kept_per_row_group_and_any_plan_is_served_from_it():
    cache = EpochCache(max_bytes=10_000)
    streamed = [int(c["x"][0]) for _, c in cache.fill(_chunks())]
    assert streamed == [0, 10, 20, 30, 40, 50] and cache.ready
    assert cache.nbytes == 6 * chunk_bytes({"x": np.zeros(10, np.float32)})
    # A plan's pieces (another order, masked boundary row groups) are indices into the split.
    pieces = [Piece(1, 0, ((5, 10),), 5), Piece(0, 2, None, 10), Piece(0, 0, ((0, 2),), 2)]
    index = cache.order(pieces)
    assert cache.columns["x"][index].tolist() == [*range(35, 40), *range(20, 30), 0, 1]
    # Mixed like the streamed pieces would be: the same pools, the same permutations.
    mixed = cache.order(pieces, buffer_rows=7, seed=[3, 0, 1])
    assert sorted(mixed.tolist()) == sorted(index.tolist()) and mixed.tolist() != index.tolist()


def test_a_split_over_budget_or_read_in_part_is_never_cached():
    over = EpochCache(max_bytes=100)  # 6 chunks of 40 bytes do not fit
    assert len(list(over.fill(_chunks()))) == 6 and over.disabled and not over.ready
    part = EpochCache(max_bytes=10_000)  # masked pieces: another shard holds the rest
    assert len(list(part.fill(_chunks(keep=((0, 5),))))) == 6 and not part.ready
    assert not EpochCache(max_bytes=0).ready and EpochCache(max_bytes=0).disabled


def test_a_fill_that_passes_nothing_on_stops_reading_at_the_chunk_over_budget():
    """The several-shard fill (one read of the whole split, nothing emitted) reads no further
    than the row group that goes over the budget, and closes the read."""
    read, closed = [], []

    def chunks():
        try:
            for piece, chunk in _chunks():
                read.append(piece.row_group)
                yield piece, chunk
        finally:
            closed.append(True)

    over = EpochCache(max_bytes=100)  # the third chunk of 40 bytes goes over
    assert list(over.fill(chunks(), emit=False)) == []
    assert len(read) == 3 and closed == [True] and over.disabled and not over.ready
    fits = EpochCache(max_bytes=10_000)
    read.clear()
    assert list(fits.fill(chunks(), emit=False)) == [] and len(read) == 6 and fits.ready


def test_binary_columns_count_their_bytes():
    chunk = {"b": np.array([b"abc", b"de"], dtype=object)}
    assert chunk_bytes(chunk) == chunk["b"].nbytes + 5


def _table(path, n=1000, rows_per_group=100):
    table = pa.table({"f": np.arange(n, dtype=np.float32), "label": np.arange(n) % 3})
    write_test_table(path, table, rows_per_group)
    return open_table(path)


def _record_reads(monkeypatch) -> list:
    """The row groups of every read of the table (one per streamed epoch), as they happen."""
    opened = []
    real = epoch_stream.read_pieces
    monkeypatch.setattr(
        epoch_stream,
        "read_pieces",
        lambda s, c, pieces, *a, **k: opened.append(pieces) or real(s, c, pieces, *a, **k),
    )
    return opened


def _rows(split, steps):
    return np.concatenate([x.numpy() for x, _ in split.dataset.take(steps)])


def test_cached_training_epochs_are_exact_reshuffled_and_resume_where_they_stopped(
    tmp_path, monkeypatch
):
    snap = _table(str(tmp_path / "t"))
    plan = plan_columns(snap, ("f",), "label")
    opened = _record_reads(monkeypatch)
    options = ReadOptions(32, training=True, shuffle_buffer=100, cache_max_bytes=1 << 20)
    split = make_dataset(snap, plan, options)
    rows = _rows(split, 4 * split.steps)
    assert len(opened) == 1  # one read of the table for four epochs
    epochs = rows.reshape(4, 1000)  # 31 batches of 32 and one of 8 each
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(1000))  # every row once, none twice
    assert len({tuple(e) for e in epochs.tolist()}) == 4  # a new order every epoch
    # A new process resumed after 2.5 epochs continues with exactly the same rows.
    resumed = make_dataset(snap, plan, options)
    at = 2 * split.steps + split.steps // 2
    resumed.start_at(at)
    expected = rows[2000 + (at - 2 * split.steps) * 32 :][:1000]
    np.testing.assert_array_equal(_rows(resumed, split.steps), expected)


def test_a_rank_whose_split_is_over_budget_stops_its_whole_split_read_early(tmp_path):
    """With several shards the cache is filled by one read of the whole split: over the
    budget, that read stops at the row group that goes over, not after all ten."""
    import functools

    from keras_dl.data.stream.epoch_stream import EpochStream
    from keras_dl.data.stream.shard_epochs import read_pieces

    snap = _table(str(tmp_path / "t"))  # 10 row groups of 100 rows
    whole = []

    def reads(snapshot, columns, pieces, *args, **kwargs):
        counted = whole if len(pieces) == 10 else []
        for item in read_pieces(snapshot, columns, pieces, *args, **kwargs):
            counted.append(item[0])
            yield item

    options = ReadOptions(
        32, training=True, shard=0, num_shards=2, cache_max_bytes=2000, shuffle_buffer=100
    )
    stream = functools.partial(EpochStream, reads=reads)
    split = make_dataset(snap, plan_columns(snap, ("f",), "label"), options, stream=stream)
    batches = list(split.dataset.take(split.steps))  # (x, y, weight): padding weighs 0
    rows = np.concatenate([x.numpy()[w.numpy() > 0] for x, _, w in batches])
    assert split.stream.cache.disabled and not split.stream.cache.ready
    assert 1 <= len(whole) < 10, f"the whole-split read went on to row group {len(whole)}"
    assert len(set(rows.tolist())) == len(rows) == 500  # this shard's epoch, every row once


def test_cache_off_reads_the_table_every_epoch(tmp_path, monkeypatch):
    snap = _table(str(tmp_path / "t"))
    opened = _record_reads(monkeypatch)
    split = make_dataset(snap, plan_columns(snap, ("f",), "label"), ReadOptions(32, training=True))
    _rows(split, 3 * split.steps)
    assert len(opened) >= 3


class _Hook:
    """Doubles ``f`` (tiled ``width`` times) and counts the rows it processed, in-graph."""

    def __init__(self, deterministic=True, width=1):
        self.deterministic = deterministic
        self.width = width
        self.rows = None

    def __call__(self, x, y):
        import tensorflow as tf

        if self.rows is None:
            with tf.init_scope():
                self.rows = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.rows.assign_add(tf.cast(tf.shape(y)[0], tf.int64))
        x = 2 * x if self.width == 1 else tf.tile(2 * x[:, None], [1, self.width])
        return x, y


def test_a_deterministic_hook_runs_once_per_row_and_the_cache_keeps_its_output(
    tmp_path, monkeypatch
):
    snap = _table(str(tmp_path / "t"))
    plan = plan_columns(snap, ("f",), "label")
    opened = _record_reads(monkeypatch)
    options = ReadOptions(32, training=True, shuffle_buffer=100, cache_max_bytes=1 << 20)
    hook = _Hook()
    split = make_dataset(snap, plan, options, hook)
    rows = _rows(split, 4 * split.steps)
    assert len(opened) == 1 and int(hook.rows.numpy()) == 1000  # read and preprocessed once
    # The same rows, in the same order, as the raw rows cached and the hook run every epoch.
    plain = _rows(make_dataset(snap, plan, options), 4 * split.steps)
    np.testing.assert_array_equal(rows, 2 * plain)
    for epoch in rows.reshape(4, -1):
        assert sorted((epoch / 2).tolist()) == list(range(1000))
    resumed = make_dataset(snap, plan, options, _Hook())
    at = 3 * split.steps - 5
    resumed.start_at(at)  # 5 steps before the end of epoch 2: 4 whole batches and one of 8
    np.testing.assert_array_equal(
        _rows(resumed, 10), rows[3000 - 4 * 32 - 8 :][: 4 * 32 + 8 + 5 * 32]
    )


def test_a_hook_that_is_random_or_too_big_to_cache_runs_in_tf_data_every_epoch(tmp_path):
    snap = _table(str(tmp_path / "t"))
    plan = plan_columns(snap, ("f",), "label")
    options = ReadOptions(32, training=True, shuffle_buffer=100, cache_max_bytes=20_000)
    for hook in (_Hook(deterministic=False), _Hook(width=10)):  # 48 bytes a row: over budget
        split = make_dataset(snap, plan, options, hook)
        rows = _rows(split, 3 * split.steps)
        assert int(hook.rows.numpy()) >= 2 * 1000 and rows.shape[0] == 3 * 1000


def test_streamed_epochs_open_the_next_reader_ahead_and_close_it_when_training_stops(
    tmp_path, monkeypatch
):
    import gc

    snap = _table(str(tmp_path / "t"))
    plan = plan_columns(snap, ("f",), "label")
    opened, closed = [], []
    real = epoch_stream.read_pieces

    def tracked(*a, **k):
        me = len(opened)  # reads overlap: the next one opens before this one ends
        opened.append(me)
        try:
            yield from real(*a, **k)
        finally:
            closed.append(me)

    monkeypatch.setattr(epoch_stream, "read_pieces", tracked)
    options = ReadOptions(32, training=True, shuffle_buffer=100)  # cache off: every epoch streams
    split = make_dataset(snap, plan, options)
    rows = _rows(split, 2 * split.steps + 3)
    gc.collect()
    # Epoch 2 was opened ahead (as epoch 1's reader neared its end), then every reader stopped.
    assert opened == [0, 1, 2] and sorted(closed) == sorted(opened)
    epochs = rows[:2000].reshape(2, -1)
    assert all(sorted(e.tolist()) == list(range(1000)) for e in epochs)
    # The same rows as reading each epoch when it starts.
    monkeypatch.setattr(epoch_stream.ReadAhead, "_open", lambda self, epoch: None)
    again = _rows(make_dataset(snap, plan, options), 2 * split.steps + 3)
    np.testing.assert_array_equal(again, rows)


def test_the_next_epochs_reader_opens_while_the_workers_decode_this_epochs_last_row_groups(
    tmp_path, monkeypatch
):
    snap = _table(str(tmp_path / "t"))  # 10 row groups of 100 rows
    plan = plan_columns(snap, ("f",), "label")
    events = []  # ("ahead", epoch) when an epoch is opened ahead; ("piece", read) per row group
    real_read, real_open = epoch_stream.read_pieces, epoch_stream.ReadAhead._open

    def tracked(*a, **k):
        me = sum(1 for e in events if e[0] == "read")
        events.append(("read", me))
        for item in real_read(*a, **k):
            events.append(("piece", me))
            yield item

    def open_ahead(self, epoch):
        events.append(("ahead", epoch))
        return real_open(self, epoch)

    monkeypatch.setattr(epoch_stream, "read_pieces", tracked)
    monkeypatch.setattr(epoch_stream.ReadAhead, "_open", open_ahead)
    options = ReadOptions(32, training=True, shuffle_buffer=100, workers=2)
    split = make_dataset(snap, plan, options)
    rows = _rows(split, 3 * split.steps)
    for epoch in (1, 2):  # opened with the last 2 row groups (one per worker) still to come
        after = events[events.index(("ahead", epoch)) :]
        assert after.count(("piece", epoch - 1)) == 2, events
    assert [e for e in events if e[0] == "ahead"][:2] == [("ahead", 1), ("ahead", 2)]
    for e in rows.reshape(3, -1):  # and every epoch is still every row once
        assert sorted(e.tolist()) == list(range(1000))
