"""The host's disk cache (``data.cache_dir``): entries appear whole or not at all, even when a
fill is killed; two processes filling one entry copy it once; a bound evicts the least recently
used entries no live process reads; a rewritten file is a new entry, never the old copy."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from keras_dl.data.tables.disk_cache import DiskCache
from tests.warm_python import REAL_PYTHON

CHILD = os.path.join(os.path.dirname(__file__), "cache_child.py")


def _child(root, max_bytes, key, size, mode, **kw) -> subprocess.Popen:
    cmd = [REAL_PYTHON, CHILD, str(root), str(max_bytes), key, str(size), mode]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)


def _entries(root) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "entries")))


def _fill_with(byte: bytes, size: int):
    def fill(path: str) -> int:
        with open(path, "r+b") as f:
            f.write(byte * size)
            return f.tell()

    return fill


def test_a_fill_killed_mid_copy_leaves_no_entry_and_the_next_fill_completes_it(tmp_path):
    root = tmp_path / "cache"
    size = 1 << 20
    child = _child(root, "none", "a0", size, "hang")
    assert child.stdout.readline().strip() == "half"  # half the copy is on disk
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert _entries(root) == []  # nothing a reader could take
    assert os.path.getsize(root / "partial" / "a0") == size  # the reservation, half written
    path = DiskCache(str(root)).get("a0", "part.parquet", size, _fill_with(b"b", size))
    assert _entries(root) == ["a0-part.parquet"]
    with open(path, "rb") as f:
        assert f.read() == b"b" * size  # the new fill's bytes, none of the killed one's
    assert os.listdir(root / "partial") == []


def test_two_processes_filling_one_entry_copy_it_once_and_both_read_it_whole(tmp_path):
    root = tmp_path / "cache"
    size = 1 << 20  # 16 chunks, 50 ms apart: the second process arrives mid-fill
    children = [_child(root, "none", "c1", size, "fill") for _ in range(2)]
    paths = {c.communicate(timeout=60)[0].strip() for c in children}
    assert all(c.returncode == 0 for c in children)
    assert paths == {str(root / "entries" / "c1-part.parquet")}
    with open(paths.pop(), "rb") as f:
        assert f.read() == b"c" * size
    with open(f"{root}.fills") as f:
        assert len(f.readlines()) == 1  # the waiting process found it filled


def test_a_bound_evicts_the_least_recently_used_entries_no_live_process_reads(tmp_path):
    root = tmp_path / "cache"
    for key in ("a1", "b1"):  # filled by a process that is gone: nobody reads them now
        done = _child(root, 250, key, 100, "quick")
        assert done.communicate(timeout=60)[0].strip().endswith(f"{key}-part.parquet")
    os.utime(root / "entries" / "a1-part.parquet", ns=(1, 1))  # a1 used longest ago
    cache = DiskCache(str(root), max_bytes=250)
    assert cache.get("c1", "part.parquet", 100, _fill_with(b"c", 100))  # evicts a1 only
    assert _entries(root) == ["b1-part.parquet", "c1-part.parquet"]
    holder = _child(root, 250, "b1", 100, "hold", stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip().endswith("b1-part.parquet")  # b1 in use
        # b1 is read by the holder, c1 by this process: d1 does not fit, it is read in place.
        assert cache.get("d1", "part.parquet", 100, _fill_with(b"d", 100)) is None
        assert _entries(root) == ["b1-part.parquet", "c1-part.parquet"]
    finally:
        holder.communicate("done\n", timeout=60)
    assert cache.get("d1", "part.parquet", 100, _fill_with(b"d", 100))  # b1 evicted now
    assert _entries(root) == ["c1-part.parquet", "d1-part.parquet"]
    assert cache.get("e1", "part.parquet", 251, _fill_with(b"e", 251)) is None  # never fits
    assert os.listdir(root / "pins") == [next(iter(os.listdir(root / "pins")))]  # ours only


def test_a_copy_of_the_wrong_length_is_refused(tmp_path):
    from keras_dl.errors import DataError

    cache = DiskCache(str(tmp_path / "cache"))
    with pytest.raises(DataError, match="read 5 bytes where the store said 9"):
        cache.get("f1", "part.parquet", 9, _fill_with(b"f", 5))
    assert _entries(tmp_path / "cache") == [] and os.listdir(tmp_path / "cache" / "partial") == []
