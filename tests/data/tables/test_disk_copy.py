"""``data.cache_dir`` over a table on S3 (moto's server): the files are copied once and read
from local disk, a rewritten file is a new entry (never the old copy), a file that does not
fit the bound is read in place, and a damaged copy fails its page checksums. Exactness through
the cache, as a property: every live row once per epoch, whatever part of the table the bound
lets the cache hold (Hypothesis)."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.data import open_table
from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables.disk_copy import cache_files
from keras_dl.data.tables.stats import count_rows
from keras_dl.errors import DataError
from keras_dl.storage import filesystem
from tests.data.stream.test_exact_reads import SETTINGS, materialize, open_spec, tables


def _write(uri: str, ids) -> None:
    fs, path = filesystem(uri)
    table = pa.table({"id": np.asarray(ids, dtype=np.int64)})
    pq.write_table(table, path, filesystem=fs, write_page_checksum=True, row_group_size=50)


def _ids(snap) -> list[int]:
    stats = count_rows(snap, ["id"])
    return sorted(
        i
        for t in iter_epoch(snap, ["id"], stats, shard=0, num_shards=1)
        for i in t["id"].to_pylist()
    )


def test_s3_files_are_cached_once_rewritten_files_refetched_and_damage_is_caught(s3, tmp_path):
    cache = str(tmp_path / "cache")
    _write(s3.uri("t/a.parquet"), range(100))
    _write(s3.uri("t/b.parquet"), range(100, 300))
    first = cache_files(open_table(s3.uri("t")), cache)
    assert _ids(first) == list(range(300))  # from S3 or the copies, whichever is ready
    assert first.local_copies.wait(timeout=60) and not first.local_copies.errors
    snap = first.with_local_copies()
    assert all(f.startswith(os.path.join(cache, "entries")) for f in snap.files)
    assert _ids(snap) == list(range(300))
    entries = sorted(os.listdir(os.path.join(cache, "entries")))
    again = cache_files(open_table(s3.uri("t")), cache)  # the next run: the same entries
    assert again.files == snap.files and again.local_copies is None
    assert sorted(os.listdir(f"{cache}/entries")) == entries
    _write(s3.uri("t/a.parquet"), range(1000, 1150))  # rewritten in place, another size
    fresh = cache_files(open_table(s3.uri("t")), cache, background=False)
    assert _ids(fresh) == [*range(100, 300), *range(1000, 1150)]  # not the stale copy
    assert len(os.listdir(f"{cache}/entries")) == 3 and fresh.local_copies is None
    # Bounded below the two files: the larger one is read from S3, still every row once.
    small = cache_files(open_table(s3.uri("t")), str(tmp_path / "small"), 2500, background=False)
    assert sum(f.startswith("s3://") for f in small.files) == 1
    assert _ids(small) == _ids(fresh)
    # A damaged copy (a flipped byte inside a data page) fails its page checksum when read.
    copied = next(f for f in fresh.files if os.path.getsize(f) == os.path.getsize(snap.files[1]))
    with open(copied, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DataError, match="(?i)crc.*data.cache_dir's local copy: delete it"):
        _ids(fresh)


def test_the_first_epoch_does_not_wait_for_the_copy_and_the_next_reads_it(s3, tmp_path):
    import boto3

    from keras_dl.data import ReadOptions, make_dataset, plan_columns

    _write(s3.uri("u/a.parquet"), range(400))
    _write(s3.uri("u/b.parquet"), range(400, 700))
    snap = cache_files(open_table(s3.uri("u")), str(tmp_path / "cache"))
    assert all(f.startswith("s3://") for f in snap.files)  # nothing waits for the copy
    split = make_dataset(
        snap, plan_columns(snap, ("id",), None), ReadOptions(64, cache_max_bytes=0)
    )

    def epoch() -> list[int]:
        ids = []
        for element in split.dataset:
            x = element[0] if isinstance(element, tuple) else element
            ids.extend(int(i) for i in (x["id"] if isinstance(x, dict) else x).numpy())
        return sorted(ids)

    assert epoch() == list(range(700))
    assert snap.local_copies.wait(timeout=60)
    client = boto3.client("s3")
    for key in ("u/a.parquet", "u/b.parquet"):  # the store loses the files: only copies remain
        client.delete_object(Bucket=s3.name, Key=key)
    assert epoch() == list(range(700))  # epoch 2, from local disk


@settings(max_examples=20, **SETTINGS)
@given(spec=tables(), shards=st.integers(1, 4), bound=st.sampled_from([None, 1, 1500, 4000]))
def test_every_live_row_is_read_once_per_epoch_through_the_cache(spec, shards, bound, tmp_path):
    path, live = materialize(spec, tmp_path)
    # One cache for every example: it fills up, and later tables are partly read in place.
    snap = cache_files(open_spec(spec, path), str(tmp_path / "cache"), max_bytes=bound)
    stats = count_rows(snap, ["id"])
    if stats.rows < shards:
        return
    for epoch in range(2):  # the first while the cache fills, the second from the copies
        union = Counter()
        for shard in range(shards):
            for t in iter_epoch(
                snap, ["id"], stats, shard=shard, num_shards=shards, shuffle=True, seed=epoch
            ):
                union.update(t.column("id").to_pylist())
        assert union == live  # every live row, once, on exactly one shard
        if snap.local_copies is not None:
            assert snap.local_copies.wait(timeout=60) and not snap.local_copies.errors
            snap = snap.with_local_copies()
    assert bound or all(f.startswith(str(tmp_path / "cache")) for f in snap.files)
