"""A training split mixed from two Delta tables by weight (data.sources), read through the
real readers into tf.data: each epoch's rows per source are the plan's shares, every rank runs
the same steps, and a stop resumed on another number of ranks trains the uninterrupted epoch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from keras_dl.config import DataConfig, SourceConfig
from keras_dl.data import make_splits
from keras_dl.data.stream.epoch_position import EpochPosition, Segment
from keras_dl.errors import DataError
from tests.conftest import write_test_table


def _table(path, n: int, base: int, split_test: int = 0) -> str:
    ids = np.arange(base, base + n + split_test, dtype=np.int64)
    write_test_table(
        str(path),
        pa.table(
            {
                "id": ids,
                "x": ids.astype(np.float32),
                "label": (ids % 10).astype(np.int64),
                "split": ["train"] * n + ["test"] * split_test,
            }
        ),
        rows_per_group=7,
        rows_per_file=20,
    )
    return str(path)


def _data(tmp_path, **kw) -> DataConfig:
    old, new = _table(tmp_path / "old", 50, 0, 5), _table(tmp_path / "new", 13, 1000, 5)
    return DataConfig(
        sources=(SourceConfig("old", old, 0.7), SourceConfig("new", new, 0.3)),
        features=("id", "x"),
        split_column="split",
        shuffle_buffer=16,
        **kw,
    )


def _epochs_ids(split, epochs: int, steps: int) -> list[Counter]:
    """The ids of the live rows of each of ``epochs`` epochs of ``steps`` batches, from one
    pass over the dataset."""
    out = [Counter() for _ in range(epochs)]
    for i, batch in enumerate(split.dataset.take(epochs * steps)):
        got = np.asarray(batch[0]["id"])
        keep = np.asarray(batch[-1]) > 0 if split.weighted else np.ones(len(got), bool)
        out[i // steps].update(got[keep].tolist())
    return out


def _epoch_ids(split, steps: int) -> Counter:
    return _epochs_ids(split, 1, steps)[0]


def test_each_epoch_trains_each_sources_share_on_any_number_of_ranks(tmp_path):
    data = _data(tmp_path, epoch_rows=40)
    per_rank = {}
    for ranks in (1, 3):
        epochs = [Counter() for _ in range(2)]
        steps = None
        for r in range(ranks):
            split = make_splits(data, batch_size=4, rank=r, world_size=ranks).train
            steps = split.steps if steps is None else steps
            assert split.steps == steps  # equal steps on every rank
            for e, ids in enumerate(_epochs_ids(split, 2, split.steps)):
                epochs[e] += ids
                by_source = split.stream.rows_by_source(e)
                assert by_source == {
                    "old": sum(c for i, c in ids.items() if i < 1000),
                    "new": sum(c for i, c in ids.items() if i >= 1000),
                }
        for ids in epochs:
            old = sum(c for i, c in ids.items() if i < 1000)
            new = sum(c for i, c in ids.items() if i >= 1000)
            assert (old, new) == (28, 12)  # 40 rows at 0.7/0.3
            assert max(c for i, c in ids.items() if i < 1000) == 1  # 28 of 50: no repeat
            # 12 of 13 new rows: a pass without repeats
            assert max(c for i, c in ids.items() if i >= 1000) == 1
        per_rank[ranks] = epochs
    # Seeded: the same rows whatever the ranks (one plan, split over them).
    assert per_rank[1] == per_rank[3]
    assert per_rank[1][0] != per_rank[1][1]  # the old source is sampled anew each epoch


def test_a_stop_resumed_on_another_number_of_ranks_trains_the_uninterrupted_epoch(tmp_path):
    data = _data(tmp_path)  # 63 rows: 44 old, 19 new (13 rows: a pass, then 6 more)
    whole = Counter()
    for r in range(2):
        split = make_splits(data, batch_size=5, rank=r, world_size=2).train
        whole += _epoch_ids(split, split.steps)
    assert sum(c for i, c in whole.items() if i >= 1000) == 19
    before = Counter()
    for r in range(2):
        split = make_splits(data, batch_size=5, rank=r, world_size=2).train
        before += _epoch_ids(split, 3)
    after = Counter()
    for r in range(3):
        split = make_splits(data, batch_size=4, rank=r, world_size=3).train
        resume = split.resume_from(EpochPosition(0, (Segment(2, 5, 3),)))
        assert resume.epoch == 0 and resume.trained_before == sum(before.values())
        after += _epoch_ids(split, resume.steps)
    assert before + after == whole


def test_a_resumed_epochs_rows_per_source_count_the_rows_trained_before_the_resume(tmp_path):
    """rows_trained/NAME counted only this attempt's rows: a resumed epoch read short."""
    from keras_dl.callbacks.rows_trained import RowsTrained

    data = _data(tmp_path)
    split = make_splits(data, batch_size=5).train
    whole = _epoch_ids(split, split.steps)
    # Stopped after 3 steps on 2 ranks of 5, resumed on this one process with batches of 4.
    split = make_splits(data, batch_size=4).train
    resume = split.resume_from(EpochPosition(0, (Segment(2, 5, 3),)))
    assert resume.epoch == 0 and 0 < resume.trained_before < sum(whole.values())
    _epoch_ids(split, resume.steps)
    counter = RowsTrained(split, before={0: resume.trained_before})
    logs: dict = {}
    counter.on_epoch_end(0, logs)
    new = sum(c for i, c in whole.items() if i >= 1000)
    assert (logs["rows_trained/old"], logs["rows_trained/new"]) == (sum(whole.values()) - new, new)
    assert logs["rows_trained"] == sum(whole.values())


def test_sources_without_data_table_say_their_validation_rows_go_unused(tmp_path, caplog):
    """Their validation rows were ignored without a word: no validation split, and early
    stopping silently on the training loss."""
    import logging

    old = _table(tmp_path / "old", 20, 0, 5)
    ids = np.arange(1000, 1010, dtype=np.int64)
    write_test_table(
        str(tmp_path / "new"),
        pa.table(
            {
                "id": ids,
                "x": ids.astype(np.float32),
                "label": (ids % 10).astype(np.int64),
                "split": ["train"] * 7 + ["validation"] * 3,
            }
        ),
        rows_per_group=7,
    )
    data = DataConfig(
        sources=(SourceConfig("old", old, 0.5), SourceConfig("new", str(tmp_path / "new"), 0.5)),
        features=("id", "x"),
        split_column="split",
    )
    with caplog.at_level(logging.WARNING, logger="keras_dl.data.splits"):
        splits = make_splits(data, batch_size=4)
    assert splits.validation is None
    assert "rows where split = 'validation' are not used (new (3))" in caplog.text
    assert "data.validation_table" in caplog.text


def test_sources_whose_columns_differ_are_refused_by_name(tmp_path):
    old = _table(tmp_path / "old", 20, 0)
    other = str(tmp_path / "other")
    write_test_table(
        other,
        pa.table(
            {
                "id": np.arange(5.0),
                "x": np.zeros(5, np.float32),
                "label": np.zeros(5, np.int64),
                "split": ["train"] * 5,
            }
        ),
        5,
    )
    data = DataConfig(
        sources=(SourceConfig("old", old, 1), SourceConfig("other", other, 1)),
        features=("id", "x"),
        split_column="split",
    )
    with pytest.raises(DataError, match=r"data.sources 'other' .*column 'id' is double, but int64"):
        make_splits(data, batch_size=4)


def _old_then_new_rows(tmp_path) -> str:
    """A table of ids 0-39 (versions 0 and 1: files of 20 rows), then ids 1000-1013 appended
    (version 2): the new rows after ``since_version=1``."""
    from deltalake import write_deltalake

    path = _table(tmp_path / "t", 40, 0)  # version 0 (and 1: files of 20 rows)
    ids = np.arange(1000, 1014, dtype=np.int64)
    new = pa.table(
        {"id": ids, "x": ids.astype(np.float32), "label": ids % 10, "split": ["train"] * 14}
    )
    write_deltalake(path, new, mode="append")
    return path


def _replay(path: str, replay: float) -> DataConfig:
    """``data.replay`` of ``path`` with ``data.since_version=1``, training rows only."""
    return DataConfig(
        table=path,
        since_version=1,
        replay=replay,
        features=("id", "x"),
        split_column="split",
        test_split="",
        validation_split="",
    )


def test_replay_mixes_the_rows_at_since_version_with_the_new_ones(tmp_path):
    """data.replay=0.3 with data.since_version=0: each epoch is the new rows (once each) and
    30 % of rows from version 0, sampled anew each epoch."""
    path = _old_then_new_rows(tmp_path)
    data = _replay(path, 0.3)
    split = make_splits(data, batch_size=4).train
    assert split.stream.names == ("replay", "new")
    assert split.stream.mix.shares == [6, 14]  # 14 new rows / 0.7 = 20 rows an epoch
    epochs = _epochs_ids(split, 2, split.steps)
    for ids in epochs:
        assert sorted(i for i in ids if i >= 1000) == list(range(1000, 1014))
        old = [i for i in ids.elements() if i < 1000]
        assert len(old) == len(set(old)) == 6
    assert {i for i in epochs[0] if i < 1000} != {i for i in epochs[1] if i < 1000}


def test_replay_never_replays_a_row_deleted_since(tmp_path):
    """Rows of version since_version deleted later are not replayed (they were: the replay
    source was the table *at* since_version). Here a DELETE after the new rows removes ids
    0-19; the replay draws only from ids 20-39, every epoch."""
    from deltalake import DeltaTable

    path = _old_then_new_rows(tmp_path)
    table = DeltaTable(path)  # change data on: the new rows stay known through the DELETE
    table.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    DeltaTable(path).delete("id < 20")
    data = _replay(path, 0.5)
    split = make_splits(data, batch_size=4).train
    epochs = _epochs_ids(split, 3, split.steps)
    for ids in epochs:
        assert sorted(i for i in ids if i >= 1000) == list(range(1000, 1014))
        old = [i for i in ids.elements() if i < 1000]
        assert old and all(20 <= i < 40 for i in old), sorted(old)
        assert len(old) == len(set(old)) == 14  # 14 new rows / 0.5 = 28 rows an epoch


def test_replay_applies_the_deletion_vectors_of_the_version_trained(copy):
    """On a table Databricks wrote: version 1's deletion vector removed 2 of version 0's 10
    rows. The rows of version 0 still live at version 1 are the other 8."""
    from keras_dl.data.sources import rows_kept
    from keras_dl.data.tables import open_table

    path = copy("table-with-dv-small")
    kept = rows_kept(open_table(path, 1), open_table(path, 0))
    assert kept.version == 1 and len(kept.files) == 1
    assert kept.live_records() == (8,)
    assert kept.deleted_rows[0].tolist() == [0, 9]
