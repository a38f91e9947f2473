"""A mixed epoch's plan (keras_dl/data/stream/mix.py): exact shares, passes without repeats,
equal steps on any number of ranks, and a stop at any step resumed on other ranks trains the
uninterrupted epoch's rows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from keras_dl.data.stream import row_ranges as rr
from keras_dl.data.stream.epoch_position import EpochPosition
from keras_dl.data.stream.mix import MixLayout, MixRows, shares, slot_sources

SETTINGS = settings(max_examples=150, deadline=None)

files = st.lists(st.integers(0, 30), min_size=1, max_size=3).filter(lambda f: sum(f) > 0)
mixes = st.fixed_dictionaries(
    {
        "file_rows": st.lists(files, min_size=2, max_size=4),
        "weights": st.lists(
            st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 1.0, 2.5]), min_size=4, max_size=4
        ),
        "epoch_rows": st.one_of(st.none(), st.integers(1, 150)),
        "shuffle": st.booleans(),
        "buffer": st.sampled_from([0, 1, 7, 32]),
        "seed": st.integers(0, 2**16),
    }
)


def _mix(spec) -> MixRows:
    weights = spec["weights"][: len(spec["file_rows"])]
    assume(sum(weights) > 0)
    return MixRows(
        spec["file_rows"],
        weights,
        spec["epoch_rows"],
        shuffle=spec["shuffle"],
        seed=spec["seed"],
        buffer=spec["buffer"],
    )


def _rows(mix: MixRows, epoch: int, pairs) -> Counter:
    """``(source, row id)`` of ``(source, draw)`` pairs."""
    ids = [mix.draws(epoch, s).ids(rr.runs([(0, n)])) for s, n in enumerate(mix.shares)]
    return Counter((s, int(ids[s][d])) for s, d in pairs)


def _epoch(mix: MixRows, epoch: int, layout: MixLayout, batch: int, skip: int = 0, steps=None):
    """``(source, draw)`` every rank of ``layout`` trains in ``steps`` steps after ``skip``."""
    sizes = mix.sizes(layout)
    out = []
    for r in range(layout.ranks):
        rank = mix.rank(epoch, layout, r)
        assert rank.rows == sizes[r]
        stop = sizes[r] if steps is None else min((skip + steps) * batch, sizes[r])
        out.extend(rank.output()[skip * batch : stop])
    return out


@SETTINGS
@given(mixes, st.integers(0, 2), st.integers(1, 8), st.integers(1, 20))
def test_every_epoch_holds_each_sources_share_each_pass_without_repeats(spec, epoch, ranks, batch):
    mix = _mix(spec)
    assume(mix.total >= ranks)
    layout = MixLayout(ranks)
    pairs = _epoch(mix, epoch, layout, batch)
    per_source = Counter(s for s, _ in pairs)
    assert [per_source[s] for s in range(len(mix.shares))] == mix.shares
    assert sum(mix.shares) == (spec["epoch_rows"] or sum(mix.rows))
    # Every draw index of a source once: the shares are split between the ranks exactly.
    assert sorted(set(pairs)) == sorted(pairs)
    for s, n in enumerate(mix.shares):
        ids = mix.draws(epoch, s).ids(rr.runs([(0, n)]))
        assert len(ids) == n
        rows = mix.rows[s]
        assert ((ids >= 0) & (ids < rows)).all()
        for p in range(0, n, rows):  # each pass (and the remainder) visits rows at most once
            one = ids[p : p + rows]
            assert len(np.unique(one)) == len(one)
    sizes = mix.sizes(layout)
    assert max(sizes) - min(sizes) <= 1
    # Seeded: the same config plans the same rows in the same order.
    again = _epoch(_mix(spec), epoch, layout, batch)
    assert again == pairs


@SETTINGS
@given(
    mixes,
    st.integers(0, 2),
    st.lists(
        st.tuples(st.integers(1, 8), st.integers(1, 20), st.floats(0, 1)), min_size=2, max_size=3
    ),
)
def test_a_stop_at_any_step_resumed_on_other_ranks_trains_the_uninterrupted_epoch(
    spec, epoch, attempts
):
    """Each attempt runs part of the epoch on its ranks and batch, the last one to its end."""
    mix = _mix(spec)
    assume(all(mix.total >= ranks for ranks, _, _ in attempts))
    whole = _rows(mix, epoch, _epoch(mix, epoch, MixLayout(attempts[0][0]), attempts[0][1]))
    trained = Counter()
    position = EpochPosition(epoch)
    for i, (ranks, batch, part) in enumerate(attempts):
        resume = mix.resume(position, ranks, batch)
        if resume.epoch != epoch:
            break
        last = i == len(attempts) - 1
        steps = resume.steps if last else int(part * resume.steps)
        pairs = _epoch(mix, epoch, resume.layout, batch, resume.skip_steps, steps)
        trained.update(_rows(mix, epoch, pairs))
        assert sum(trained.values()) == resume.trained_before + len(pairs)
        position = resume.record(epoch, steps)
        counts = mix.trained_counts(epoch, position.segments)
        per_source = Counter(s for s, _ in trained.elements())
        assert counts == [per_source[s] for s in range(len(mix.shares))]
        sizes = mix.sizes(resume.layout)
        assert max(sizes) - min(sizes) <= 1
    assert trained == whole
    assert mix.resume(position, attempts[-1][0], attempts[-1][1]).epoch == epoch + 1


def test_shares_round_by_largest_remainder():
    assert shares([100, 100], [0.7, 0.3], 10) == [7, 3]
    assert shares([5, 5, 5], [1, 1, 1], 10) == [4, 3, 3]  # a tie goes to the earlier source
    assert shares([3, 900], [0.5, 0.5]) == [452, 451]
    assert shares([10, 10], [1, 0]) == [20, 0]
    with pytest.raises(ValueError, match="source 1 has weight"):
        shares([10, 0], [1, 1])
    with pytest.raises(ValueError, match="not all 0"):
        shares([10, 10], [0, 0])


def test_a_small_source_repeats_as_whole_passes_then_a_remainder():
    mix = MixRows([[3], [100]], [0.5, 0.5], 20, shuffle=True, seed=3)
    assert mix.shares == [10, 10]
    ids = mix.draws(0, 0).ids(rr.runs([(0, 10)]))
    assert [sorted(ids[p : p + 3].tolist()) for p in (0, 3, 6)] == [[0, 1, 2]] * 3
    assert len(set(ids[9:].tolist())) == 1
    # A larger source is sampled anew each epoch.
    assert set(mix.draws(0, 1).ids(rr.runs([(0, 10)]))) != set(
        mix.draws(1, 1).ids(rr.runs([(0, 10)]))
    )


def test_unshuffled_slots_spread_each_source_evenly():
    assert slot_sources([2, 4], False, [0]).tolist() == [1, 0, 1, 1, 0, 1]
