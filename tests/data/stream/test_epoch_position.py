"""A training epoch stopped on R ranks and resumed on R' ranks trains every live row once.

The position a checkpoint keeps (:mod:`keras_dl.data.stream.epoch_position`) is a list of segments
``(ranks, batch per rank, steps)``; these tests stop reads as a checkpoint would, resume them
on another number of ranks (and again on a third), and count the rows every rank trained."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.data import ReadOptions, make_dataset, open_table, plan_columns
from keras_dl.data.stream import row_ranges as rr
from keras_dl.data.stream.epoch_position import EpochPosition, EpochRows, Segment
from keras_dl.data.stream.epoch_stream import EpochStream
from tests.data.stream.test_exact_reads import SETTINGS, materialize, open_spec, tables
from tests.fixtures.delta_protocol import write_protocol_table


def _stream_batches(stream: EpochStream):
    """``(ids, weights)`` of each batch ``stream`` hands to training, in order."""
    for block in stream.generate():
        ids = np.asarray(block[0])
        weights = np.asarray(block[2]) if stream.weighted else np.ones(ids.shape)
        for i in range(len(ids)):
            yield ids[i], weights[i]


def _trained(batches, steps: int) -> Counter:
    out = Counter()
    for _ in range(steps):
        ids, weights = next(batches)
        out.update(ids[weights > 0].tolist())
    return out


def _streams(snap, plan, ranks: int, batch: int, **kw) -> list[EpochStream]:
    return [
        EpochStream(snap, plan, ReadOptions(batch, training=True, shard=r, num_shards=ranks, **kw))
        for r in range(ranks)
    ]


def _issue_table(tmp_path) -> str:
    """1,000 live rows in 3 files, with row groups of 100, 50 and 70 rows."""
    path = str(tmp_path / "t")
    files, start = [], 0
    for rows, group in ((400, 100), (300, 50), (300, 70)):
        parts = []
        for lo in range(0, rows, group):
            ids = np.arange(start + lo, start + min(lo + group, rows), dtype=np.int64)
            parts.append(pa.table({"id": ids, "x": ids.astype(np.float32)}))
        files.append(parts)
        start += rows
    write_protocol_table(path, files, [[] for _ in files])
    return path


def _tf_trained(split, steps: int, it=None) -> Counter:
    """Rows (weight > 0) of ``steps`` batches of a split's tf.data dataset, as ``fit`` reads."""
    it = it or iter(split.dataset)
    out = Counter()
    for _ in range(steps):
        element = next(it)
        ids = element[0].numpy()
        if split.weighted:
            ids = ids[element[2].numpy() > 0]
        out.update(ids.tolist())
    return out


@pytest.mark.parametrize("before,after", [(2, 2), (2, 3), (3, 2), (4, 1), (1, 4)])
def test_the_issue_table_reads_zero_twice_and_zero_never_through_tf_data(tmp_path, before, after):
    # The table of issue 32: a global batch of 60, a checkpoint after 7 steps on `before`
    # ranks, the resume on `after` ranks with the same global batch.
    snap = open_table(_issue_table(tmp_path))
    plan = plan_columns(snap, ["id"], "x")
    live = Counter(range(1000))

    def splits(ranks):
        return [
            make_dataset(
                snap, plan, ReadOptions(60 // ranks, training=True, shard=r, num_shards=ranks)
            )
            for r in range(ranks)
        ]

    first = Counter()
    for split in splits(before):
        first += _tf_trained(split, 7)
    position = EpochPosition(0, (Segment(before, 60 // before, 7),))
    second, later = Counter(), Counter()
    resumed = splits(after)
    steps = {split.resume_from(position).steps for split in resumed}
    assert len(steps) == 1  # every rank runs the same steps
    for split in resumed:
        it = iter(split.dataset)
        second += _tf_trained(split, next(iter(steps)), it)
        later += _tf_trained(split, split.steps, it)  # the next epoch, planned for `after`
    epoch = first + second
    twice = sum(n - 1 for n in epoch.values() if n > 1)
    never = len(set(live) - set(epoch))
    assert (twice, never) == (0, 0)
    assert epoch == live and later == live


@settings(max_examples=40, **SETTINGS)
@given(
    spec=tables(),
    ranks=st.lists(st.integers(1, 8), min_size=2, max_size=3),
    batch=st.integers(1, 9),
    cut=st.lists(st.floats(0, 1), min_size=2, max_size=2),
    epoch=st.integers(0, 1),
    shuffle=st.booleans(),
    cache=st.sampled_from([0, 1 << 20]),
)
def test_an_epoch_stopped_and_resumed_on_other_ranks_trains_every_live_row_once(
    spec, ranks, batch, cut, epoch, shuffle, cache, tmp_path
):
    path, live = materialize(spec, tmp_path)
    snap = open_spec(spec, path)
    plan = plan_columns(snap, ["id"], "x")
    rows = sum(live.values())
    if rows < max(ranks):
        return  # more ranks than rows: refused with a clear error (test_tfdata)
    kw = dict(shuffle=shuffle, shuffle_buffer=5, cache_max_bytes=cache)
    position, trained = EpochPosition(epoch), Counter()
    # Attempts on ranks[0], ranks[1] (and ranks[2]): each but the last stops mid-epoch.
    for i, r in enumerate(ranks):
        streams = _streams(snap, plan, r, batch, **kw)
        resumes = [s.resume_from(position) for s in streams]
        assert len({x.steps for x in resumes}) == 1 and len({x.epoch for x in resumes}) == 1
        if resumes[0].epoch != epoch:  # a stop at the epoch's last step: nothing left
            assert trained == live
            return
        last = i == len(ranks) - 1
        steps = resumes[0].steps if last else int(cut[i] * resumes[0].steps)
        iterators = [_stream_batches(s) for s in streams]
        for it in iterators:
            trained += _trained(it, steps)
        if last:
            assert trained == live  # the interrupted epoch: every live row once
            for s in streams:  # the next epochs are exact on r ranks
                assert s.resume.epoch == epoch
            nxt = Counter()
            for it in iterators:
                nxt += _trained(it, streams[0].steps)
            assert nxt == live
        else:
            position = streams[0].record(epoch, steps)
            assert all(s.record(epoch, steps) == position for s in streams)
            assert EpochPosition.from_json(position.to_json()) == position
            assert EpochPosition.from_ints(position.to_ints()) == position
        for s in streams:
            s.close()


def test_a_resume_on_the_same_ranks_continues_the_same_rows_in_the_same_order(tmp_path):
    snap = open_table(_issue_table(tmp_path))
    plan = plan_columns(snap, ["id"], "x")
    whole = [_stream_batches(s) for s in _streams(snap, plan, 3, 20, shuffle_buffer=64)]
    ref = [[next(it)[0].tolist() for _ in range(30)] for it in whole]
    resumed = _streams(snap, plan, 3, 20, shuffle_buffer=64)
    for s in resumed:
        assert not s.resume_from(EpochPosition(0, (Segment(3, 20, 9),))).moved
    got = [[next(it)[0].tolist() for _ in range(21)] for it in map(_stream_batches, resumed)]
    assert got == [r[9:] for r in ref]


def test_more_ranks_than_rows_left_pad_the_empty_ranks_at_weight_zero(tmp_path):
    snap = open_table(_issue_table(tmp_path))
    plan = plan_columns(snap, ["id"], "x")
    first = Counter()
    for it in map(_stream_batches, _streams(snap, plan, 1, 999, shuffle=False)):
        first += _trained(it, 1)  # 999 of 1,000 rows: one is left for 4 ranks
    position = EpochPosition(0, (Segment(1, 999, 1),))
    streams = _streams(snap, plan, 4, 5, shuffle=False)
    rest = Counter()
    for s in streams:
        assert s.resume_from(position).steps == 1
        ids, weights = next(_stream_batches(s))
        assert len(ids) == 5  # every rank runs a whole batch
        rest.update(ids[weights > 0].tolist())
    assert first + rest == Counter(range(1000))


def test_the_record_of_a_ten_billion_row_epoch_is_small_and_plans_fast():
    # 10,000 files of 1,000,000 rows in 8 row groups: 10 billion rows, 80,000 row groups.
    import json

    files = [1_000_000] * 10_000
    rows_of = EpochRows(files, lambda f: (125_000,) * 8, shuffle=True, seed=42, buffer=4096)
    position = EpochPosition(3, (Segment(8, 512, 1_000_000),))
    assert len(json.dumps(position.to_json())) < 100
    resume = rows_of.resume(position, 6, 512)  # its time is measured by bench plan
    trained = 8 * 512 * 1_000_000
    assert resume.trained_before == trained and resume.moved
    assert rr.count(resume.layout.rest) == 10_000_000_000 - trained
