"""Row groups fetched ahead from an object store (moto's S3 server): coalesced ranges, a bytes
bound, and the very rows, in the very order, of a read without it (Hypothesis)."""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from keras_dl.data.stream import shard_epochs
from keras_dl.data.stream.read_options import IoOptions
from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables.stats import count_rows
from keras_dl.storage import s3_filesystem
from keras_dl.storage.ranges import RangeFile, coalesce
from tests.data.stream.test_exact_reads import SETTINGS, materialize, open_spec, tables


def test_ranges_merge_across_small_holes_and_split_above_the_limit():
    assert coalesce([(100, 10), (0, 50), (60, 20)], hole=10) == [(0, 80), (100, 10)]
    assert coalesce([(0, 50), (61, 9)], hole=10) == [(0, 50), (61, 9)]
    assert coalesce([(0, 0), (5, 5), (7, 1)]) == [(5, 5)]  # empty dropped, nested merged
    assert coalesce([(0, 100)], limit=30) == [(0, 25), (25, 25), (50, 25), (75, 25)]


def test_a_range_file_serves_fetched_bytes_and_reads_the_rest_from_the_file():
    data = bytes(range(256)) * 4
    reads = []

    def read_at(offset, n):
        reads.append((offset, n))
        return data[offset : offset + n]

    f = RangeFile(len(data), [(100, data[100:200]), (500, data[500:600])], read_at)
    f.seek(120)
    assert bytes(f.read(50)) == data[120:170] and not reads
    f.seek(190)
    assert bytes(f.read(20)) == data[190:210] and reads == [(190, 20)]  # past the range
    assert f.missed_bytes == 20 and f.seek(0, 2) == len(data) and f.read(5) == b""
    # A range cut in parts (at the request limit) serves a read across the cut.
    cut = RangeFile(len(data), [(0, data[:10]), (10, data[10:30])], read_at)
    assert bytes(cut.read(25)) == data[:25] and cut.missed_bytes == 0


@pytest.fixture
def fetches(monkeypatch):
    """Every prefetch the reads open (the real ones, kept to look at afterwards)."""
    made = []
    real = shard_epochs.open_prefetch

    def keep(*args, **kwargs):
        prefetch = real(*args, **kwargs)
        made.append(prefetch)
        return prefetch

    monkeypatch.setattr(shard_epochs, "open_prefetch", keep)
    return made


def upload(local: str, s3, name: str) -> str:
    """Copy a table's folder to the bucket; its URI there."""
    pafs.copy_files(local, f"{s3.name}/{name}", destination_filesystem=s3_filesystem())
    return s3.uri(name)


# Deletion vectors in their own files, read from the bucket (a URI the store once refused).
DV_FILES = {"files": [[3, 4], [5]], "deleted": [[0, 4], [2]], "mapping": True, "inline": False}


@settings(max_examples=12, **SETTINGS)
@example(spec=DV_FILES, shards=2, workers=2, shuffle=True, concurrency=2, max_bytes=1)
@given(
    spec=tables(),
    shards=st.integers(1, 3),
    workers=st.integers(1, 3),
    shuffle=st.booleans(),
    concurrency=st.integers(1, 4),
    max_bytes=st.sampled_from([1, 2000, 1 << 20]),  # one row group at a time, a few, all
)
def test_a_remote_epoch_fetched_ahead_reads_every_live_row_once_in_the_planned_order(
    spec, shards, workers, shuffle, concurrency, max_bytes, s3, fetches, tmp_path
):
    local, live = materialize(spec, tmp_path)
    remote = open_spec(spec, upload(local, s3, f"t-{uuid.uuid4().hex[:8]}"))
    assert remote.files[0].startswith("s3://")
    stats = count_rows(remote, ["id"])
    if stats.rows < shards:
        return  # refused with a clear error (test_exact_reads)
    union = Counter()
    for shard in range(shards):
        fetches.clear()

        def read(io, shard=shard):
            tables_ = iter_epoch(
                remote,
                ["id"],
                stats,
                shard=shard,
                num_shards=shards,
                shuffle=shuffle,
                seed=1,
                workers=workers,
                io=io,
            )
            return [i for t in tables_ for i in t.column("id").to_pylist()]

        ahead = read(IoOptions(concurrency, max_bytes))
        (prefetch,) = fetches
        assert prefetch.fetched_bytes > 0  # the workers decoded fetched bytes
        # Requests: the footers and at most one coalesced range per row group (a few bytes
        # each here), none column by column, none past the fetched ranges.
        assert prefetch.requests <= 2 * len(prefetch.order)
        assert read(IoOptions(0)) == ahead  # the same rows in the same order
        assert len(ahead) == stats.shard_rows(shard, shards)
        union.update(ahead)
    assert union == live  # every live row, once, on exactly one shard


def test_the_bytes_fetched_ahead_stay_within_the_bound(s3, fetches, tmp_path):
    from keras_dl.data import open_table
    from keras_dl.data.ingest import write_table

    table = pa.table({f"c{i}": np.random.default_rng(i).random(8000) for i in range(8)})
    uri = s3.uri("wide")
    write_table(table, uri, rows_per_group=1000)  # 8 row groups, 8 KB a column chunk
    snap = open_table(uri)
    assert len(snap.files) == 1
    stats = count_rows(snap, ["c0", "c3"])
    meta = pq.read_metadata(snap.files[0][len("s3://") :], filesystem=s3_filesystem())
    planned = [
        sum(meta.row_group(rg).column(i).total_compressed_size for i in (0, 3))
        for rg in range(meta.num_row_groups)
    ]
    assert len(planned) == 8
    bound = 3 * max(planned)
    rows = sum(len(t) for t in iter_epoch(snap, ["c0", "c3"], stats, io=IoOptions(8, bound)))
    assert rows == 8000
    (prefetch,) = fetches
    # Never more than three row groups' bytes requested and not yet decoded at once; only the
    # planned columns' chunks fetched (c0 and c3 lie 16 KB apart: two ranges a row group), and
    # one footer.
    assert 0 < prefetch.peak_bytes <= bound
    assert prefetch.requests == 2 * 8 + 1
    assert prefetch.fetched_bytes <= sum(planned) + (64 << 10)


def test_a_file_gone_from_the_store_is_named_as_without_fetching_ahead(s3, fetches):
    from keras_dl.data import open_table
    from keras_dl.data.ingest import write_table
    from keras_dl.errors import DataError

    uri = s3.uri("gone")
    write_table(pa.table({"x": np.arange(100)}), uri, rows_per_group=30)
    snap = open_table(uri)
    stats = count_rows(snap, ["x"])
    s3_filesystem().delete_file(snap.files[0][len("s3://") :])
    name = snap.files[0].rsplit("/", 1)[1]
    for io in (IoOptions(4), IoOptions(0)):
        with pytest.raises(DataError, match=name):
            list(iter_epoch(snap, ["x"], stats, io=io))


def test_the_first_epoch_opens_a_remote_tables_footers_at_once_each_once(s3, monkeypatch):
    """A Delta log counts each file's rows, not each row group's: the epoch's first plan needs
    every footer it reads. On a store they are opened together, on the footer threads."""
    import threading

    from keras_dl.data import open_table
    from keras_dl.data.ingest import write_table
    from keras_dl.errors import DataError

    uri = s3.uri("footers")
    for part in range(4):  # 4 appends: 4 files of 2 row groups
        ids = np.arange(part * 25, part * 25 + 25)
        write_table(pa.table({"x": ids}), uri, mode="error" if part == 0 else "append",
                    rows_per_group=13)  # fmt: skip
    snap = open_table(uri)
    stats = count_rows(snap, ["x"])
    assert len(snap.files) == 4 and stats.group_rows is None  # from the log: no footer read
    opened = []
    real = shard_epochs.open_file

    def spy(snapshot, index, *args, **kwargs):
        opened.append((index, threading.current_thread().name))
        return real(snapshot, index, *args, **kwargs)

    monkeypatch.setattr(shard_epochs, "open_file", spy)
    groups = shard_epochs.RowGroupCounts(snap, stats, ["x"], concurrency=4)
    rows = [i for t in iter_epoch(snap, ["x"], stats, groups=groups, shuffle=True, seed=3)
            for i in t.column("x").to_pylist()]  # fmt: skip
    assert sorted(rows) == list(range(100))
    assert sorted(i for i, _ in opened) == [0, 1, 2, 3]  # each footer once
    assert all(name.startswith("keras_dl-footer") for _, name in opened), opened
    assert groups.known == {i: (13, 12) for i in range(4)}
    # A file that is not Parquet is named, as one at a time would name it.
    bad = snap.files[2][len("s3://") :]
    with s3_filesystem().open_output_stream(bad) as out:
        out.write(b"not parquet")
    with pytest.raises(DataError, match=snap.files[2].rsplit("/", 1)[1]):
        list(iter_epoch(snap, ["x"], stats))


def test_later_epochs_start_with_the_files_the_first_one_opened(s3, fetches, monkeypatch):
    """A file's size and footer cost two round trips: fetched by the first epoch's prefetch,
    kept for the next epochs' prefetches of the same snapshot, and fetched again by the next
    snapshot of the table (a new run, or a new version)."""
    from keras_dl.data import open_table
    from keras_dl.data.ingest import write_table
    from keras_dl.data.stream import prefetch as prefetch_module

    uri = s3.uri("epochs")
    for part in range(3):
        ids = np.arange(part * 40, part * 40 + 40)
        write_table(pa.table({"x": ids}), uri, mode="error" if part == 0 else "append",
                    rows_per_group=15)  # fmt: skip
    opens = []
    real = prefetch_module.filesystem
    monkeypatch.setattr(prefetch_module, "filesystem", lambda u: opens.append(u) or real(u))

    def epoch(snap, seed):
        stats = count_rows(snap, ["x"])
        rows = [i for t in iter_epoch(snap, ["x"], stats, shuffle=True, seed=seed, io=IoOptions(4))
                for i in t.column("x").to_pylist()]  # fmt: skip
        assert sorted(rows) == list(range(120))
        return rows, fetches[-1]

    snap = open_table(uri)
    first, one = epoch(snap, 1)
    assert sorted(opens) == sorted(snap.files)  # each file opened once
    opens.clear()
    second, two = epoch(snap, 2)
    assert opens == [] and second != first  # reshuffled, from the kept files
    assert two.requests == one.requests - 3  # the three footers not fetched again
    assert epoch(snap, 2)[0] == second  # the same plan reads the same rows, in order
    again = open_table(uri)
    epoch(again, 1)
    assert sorted(opens) == sorted(again.files)  # a new snapshot opens its files again
