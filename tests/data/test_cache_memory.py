"""data.cache=auto: small splits are read once, then replayed from memory, exactly and reshuffled."""

import numpy as np
import pyarrow as pa

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns, tfdata
from keras_dl.data.cache_memory import EpochCache, chunk_bytes
from tests.conftest import write_delta


def _reads():
    """A fake table of 6 chunks of 10 rows; ``calls`` records which epochs were read."""
    calls = []

    def read(epoch):
        calls.append(epoch)
        for i in range(6):
            yield {"x": np.arange(10 * i, 10 * i + 10, dtype=np.float32)}

    return read, calls


def _epoch(cache, epoch, read):
    return [int(c["x"][0]) for c in cache.epoch(epoch, read)]


def test_first_epoch_streams_and_later_epochs_replay_reshuffled_chunks():
    read, calls = _reads()
    cache = EpochCache(max_bytes=10_000, shuffle=True, seed=3)
    orders = [_epoch(cache, e, read) for e in range(4)]
    assert calls == [0]  # the table was read once
    assert all(sorted(o) == [0, 10, 20, 30, 40, 50] for o in orders)
    assert orders[0] == [0, 10, 20, 30, 40, 50] and len({tuple(o) for o in orders}) == 4
    assert cache.nbytes == 6 * chunk_bytes({"x": np.zeros(10, np.float32)})


def test_a_resumed_run_refills_from_epoch_zero_and_serves_the_same_order():
    read, _ = _reads()
    cache = EpochCache(max_bytes=10_000, shuffle=True, seed=3)
    original = [_epoch(cache, e, read) for e in range(3)]
    read2, calls2 = _reads()
    resumed = EpochCache(max_bytes=10_000, shuffle=True, seed=3)
    assert _epoch(resumed, 2, read2) == original[2] and calls2 == [0]


def test_a_split_over_budget_streams_every_epoch_as_without_the_cache():
    read, calls = _reads()
    cache = EpochCache(max_bytes=100, shuffle=True, seed=3)  # 6 chunks of 40 bytes do not fit
    assert [_epoch(cache, e, read) for e in range(3)] == [[0, 10, 20, 30, 40, 50]] * 3
    assert calls == [0, 1, 2] and cache.disabled and cache.chunks is None
    off = EpochCache(max_bytes=0, shuffle=False)
    read, calls = _reads()
    _epoch(off, 0, read), _epoch(off, 1, read)
    assert calls == [0, 1]


def test_binary_columns_count_their_bytes():
    chunk = {"b": np.array([b"abc", b"de"], dtype=object)}
    assert chunk_bytes(chunk) == chunk["b"].nbytes + 5


def _table(path, n=1000, rows_per_group=100):
    table = pa.table({"f": np.arange(n, dtype=np.float32), "label": np.arange(n) % 3})
    write_delta(path, table, rows_per_group)
    return open_table(path)


def _record_reads(monkeypatch) -> list:
    """The seed of every read of the table (one per streamed epoch), as they happen."""
    opened = []
    real = tfdata.iter_epoch_arrays
    monkeypatch.setattr(
        tfdata, "iter_epoch_arrays", lambda *a, **k: opened.append(k["seed"]) or real(*a, **k)
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
    epochs = rows.reshape(4, split.steps * 32)
    for epoch in epochs:
        assert len(set(epoch.tolist())) == split.steps * 32  # each row at most once, none twice
    assert len({tuple(e) for e in epochs.tolist()}) == 4  # a new order every epoch
    # A new process resumed after 2.5 epochs continues with exactly the same rows.
    resumed = make_dataset(snap, plan, options)
    at = 2 * split.steps + split.steps // 2
    resumed.start_at(at)
    np.testing.assert_array_equal(_rows(resumed, split.steps), rows[at * 32 :][: split.steps * 32])


def test_cache_off_reads_the_table_every_epoch(tmp_path, monkeypatch):
    snap = _table(str(tmp_path / "t"))
    opened = []
    real = tfdata.iter_epoch_arrays
    monkeypatch.setattr(
        tfdata, "iter_epoch_arrays", lambda *a, **k: opened.append(1) or real(*a, **k)
    )
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
        assert len(set(epoch.tolist())) == split.steps * 32
    resumed = make_dataset(snap, plan, options, _Hook())
    at = 3 * split.steps - 5
    resumed.start_at(at)
    np.testing.assert_array_equal(_rows(resumed, 10), rows[at * 32 :][: 10 * 32])


def test_a_hook_that_is_random_or_too_big_to_cache_runs_in_tf_data_every_epoch(tmp_path):
    snap = _table(str(tmp_path / "t"))
    plan = plan_columns(snap, ("f",), "label")
    options = ReadOptions(32, training=True, shuffle_buffer=100, cache_max_bytes=20_000)
    for hook in (_Hook(deterministic=False), _Hook(width=10)):  # 48 bytes a row: over budget
        split = make_dataset(snap, plan, options, hook)
        rows = _rows(split, 3 * split.steps)
        assert int(hook.rows.numpy()) >= 2 * 1000 and rows.shape[0] == 3 * split.steps * 32


def test_streamed_epochs_open_the_next_reader_ahead_and_close_it_when_training_stops(
    tmp_path, monkeypatch
):
    import gc

    snap = _table(str(tmp_path / "t"))
    plan = plan_columns(snap, ("f",), "label")
    opened, closed = [], []
    real = tfdata.iter_epoch_arrays

    def tracked(*a, **k):
        opened.append(k["seed"])
        try:
            yield from real(*a, **k)
        finally:
            closed.append(k["seed"])

    monkeypatch.setattr(tfdata, "iter_epoch_arrays", tracked)
    options = ReadOptions(32, training=True, shuffle_buffer=100)  # cache off: every epoch streams
    split = make_dataset(snap, plan, options)
    rows = _rows(split, 2 * split.steps + 3)
    gc.collect()
    # Epoch 2 was opened ahead (as epoch 1's reader ended), then every reader was stopped.
    assert opened == [42, 43, 44] and sorted(closed) == sorted(opened)
    epochs = rows[: 2 * split.steps * 32].reshape(2, -1)
    assert all(len(set(e.tolist())) == split.steps * 32 for e in epochs)
    # The same rows as reading each epoch when it starts.
    monkeypatch.setattr(tfdata._ReadAhead, "_open", lambda self, epoch: None)
    np.testing.assert_array_equal(_rows(make_dataset(snap, plan, options), len(rows) // 32), rows)
