"""MDS folders (Mosaic StreamingDataset) read as tables: every row of every fixture as the
real library's reader decoded it (``fixtures/mds/expected.json``), exact epochs, lineage, and
clear refusals."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_dl.data.stream.shard_epochs import iter_epoch
from keras_dl.data.tables import open_table
from keras_dl.data.tables.mds_shards import SHAPE_SUFFIX
from keras_dl.data.tables.stats import count_rows
from keras_dl.errors import DataError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "mds"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["rows"]


@pytest.fixture(autouse=True, scope="module")
def mds_cache(tmp_path_factory):
    """Decoded shards go to a temporary folder, not ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KERAS_DL_MDS_CACHE", str(tmp_path_factory.mktemp("mds_cache")))
    yield
    mp.undo()


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    return target


def _read(table, columns=None, shard=0, num_shards=1, shuffle=False, seed=None) -> pa.Table:
    snapshot = table if not isinstance(table, str | Path) else open_table(str(table))
    columns = columns or snapshot.schema.names
    stats = count_rows(snapshot, columns)
    parts = iter_epoch(
        snapshot, columns, stats, shard=shard, num_shards=num_shards, shuffle=shuffle, seed=seed
    )
    return pa.concat_tables(list(parts)) if stats.rows else snapshot.schema.empty_table()


def _check(ours, field: pa.Field, shape, want) -> None:
    """One decoded value against the library's (as make_fixtures.py tagged it)."""
    if "image" in want:
        from PIL import Image

        pixels = np.asarray(Image.open(io.BytesIO(ours)))
        assert pixels.tolist() == want["image"]
    elif "values" in want:  # an ndarray
        assert np.dtype(field.type.value_type.to_pandas_dtype()).name == want["dtype"]
        assert list(shape) == want["shape"]
        assert (
            np.array(ours, want["dtype"]).tolist()
            == np.array(want["values"], want["dtype"]).tolist()
        )
    elif "value" in want:  # a numpy scalar
        assert np.dtype(field.type.to_pandas_dtype()).name == want["dtype"]
        assert np.array(ours, want["dtype"]) == np.array(want["value"], want["dtype"])
    elif "int" in want:
        assert ours == int(want["int"])
    elif "float" in want:
        assert ours == want["float"]
    elif "base64" in want:
        assert ours == base64.b64decode(want["base64"])
    elif "decimal" in want:
        assert ours == want["decimal"]
    elif field.metadata[b"mds.encoding"] == b"json":
        assert json.loads(ours) == want["json"]
    else:
        assert ours == want["json"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_row_is_what_the_library_reads(name):
    snapshot = open_table(str(FIXTURES / name))
    rows = _read(snapshot).to_pylist()
    expected = EXPECTED[name]
    assert len(rows) == len(expected) == sum(snapshot.file_records)
    for ours, want in zip(rows, expected):
        assert set(want) == {c for c in ours if not c.endswith(SHAPE_SUFFIX)}
        for column, value in want.items():
            field = snapshot.schema.field(column)
            meta = field.metadata or {}
            if b"mds.shape" in meta:
                shape = [int(d) for d in meta[b"mds.shape"].split(b",")]
            else:
                shape = ours.get(column + SHAPE_SUFFIX)
            _check(ours[column], field, shape, value)


def test_lineage_version_comes_from_shard_hashes_or_the_index(tmp_path):
    hashed = open_table(str(FIXTURES / "scalars"))
    assert hashed.format == "mds" and hashed.version is None and not hashed.versioned
    assert hashed.lineage["data.version"].startswith("shards-sha256-")
    assert hashed.lineage["data.format"] == "mds"
    copy = _copy(tmp_path, "scalars")  # same shards, same hashes, elsewhere: same version
    assert open_table(str(copy)).lineage["data.version"] == hashed.lineage["data.version"]
    unhashed = open_table(str(FIXTURES / "arrays_zstd"))  # written without hashes
    assert unhashed.lineage["data.version"].startswith("index-sha256-")


def test_decoded_shards_are_reused(tmp_path):
    first = open_table(str(FIXTURES / "compressed_gz"))
    stamps = [Path(f).stat().st_mtime_ns for f in first.files]
    again = open_table(str(FIXTURES / "compressed_gz"))
    assert again.files == first.files
    assert [Path(f).stat().st_mtime_ns for f in again.files] == stamps


def test_pickle_columns_are_refused_by_name():
    folder = FIXTURES / "pickled"
    with pytest.raises(DataError, match="'obj'") as err:
        open_table(str(folder))
    assert str(folder) in str(err.value) and "Re-write that column" in str(err.value)


def test_an_ndarray_column_of_mixed_dtypes_is_refused():
    with pytest.raises(DataError, match="Column 'a'.*int64.*float32"):
        open_table(str(FIXTURES / "mixed_dtypes"))


def _edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / "index.json").read_text())
    for shard in index["shards"]:
        edit(shard)
    (folder / "index.json").write_text(json.dumps(index))


def test_a_missing_shard_is_named(tmp_path):
    folder = _copy(tmp_path, "scalars")
    (folder / "shard.00002.mds").unlink()
    with pytest.raises(DataError, match="'shard.00002.mds'.*is missing"):
        open_table(str(folder))


def test_a_cut_shard_is_named(tmp_path):
    folder = _copy(tmp_path, "arrays_zstd")
    shard = folder / "shard.00001.mds.zstd"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(DataError, match="'shard.00001.mds.zstd'.*bytes where index.json"):
        open_table(str(folder))


def test_a_changed_shard_fails_its_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_DL_MDS_CACHE", str(tmp_path / "cache"))  # decoded afresh
    folder = _copy(tmp_path, "scalars")
    shard = folder / "shard.00003.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="'shard.00003.mds'.*sha1 hash"):
        open_table(str(folder))


def test_an_unknown_encoding_is_named(tmp_path):
    folder = _copy(tmp_path, "compressed_gz")
    _edit_index(folder, lambda s: s["column_encodings"].__setitem__(1, "list[pil]"))
    with pytest.raises(DataError, match="Column 'name'.*'list\\[pil\\]'"):
        open_table(str(folder))


def test_an_unsupported_compression_is_named(tmp_path):
    folder = _copy(tmp_path, "compressed_gz")
    _edit_index(folder, lambda s: s.__setitem__("compression", "lz4"))
    with pytest.raises(DataError, match="'shard.00000.mds.gz'.*'lz4'"):
        open_table(str(folder))


def test_a_shard_of_another_mds_version_is_refused(tmp_path):
    folder = _copy(tmp_path, "compressed_gz")
    _edit_index(folder, lambda s: s.__setitem__("version", 3))
    with pytest.raises(DataError, match="'shard.00000.mds.gz'.*MDS version 3"):
        open_table(str(folder))


def test_a_shard_of_another_format_is_refused(tmp_path):
    folder = _copy(tmp_path, "compressed_gz")
    _edit_index(folder, lambda s: s.__setitem__("format", "jsonl"))
    with pytest.raises(DataError, match="format 'jsonl'.*MDS shards only"):
        open_table(str(folder))


def _write_ids(folder: Path, sizes: list[int]) -> list[int]:
    """An MDS folder of one ``int64`` column ``k`` (the row's number), shards of ``sizes`` rows,
    laid out as MDSWriter lays them out (the fixtures check the decoding; this, the planning)."""
    folder.mkdir()
    shards, k = [], 0
    for i, n in enumerate(sizes):
        samples = [np.int64(k + j).tobytes() for j in range(n)]
        k += n
        head = 4 + 4 * (n + 1)
        offsets = np.cumsum([head, *(len(x) for x in samples)]).astype(np.uint32)
        data = np.uint32(n).tobytes() + offsets.tobytes() + b"".join(samples)
        (folder / f"shard.{i:05d}.mds").write_bytes(data)
        shards.append(
            {"column_encodings": ["int64"], "column_names": ["k"], "column_sizes": [8]}
            | {"compression": None, "format": "mds", "hashes": [], "samples": n}
            | {"raw_data": {"basename": f"shard.{i:05d}.mds", "bytes": len(data), "hashes": {}}}
            | {"size_limit": 1 << 26, "version": 2, "zip_data": None}
        )
    (folder / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return list(range(k))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    num_shards=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_row_once_per_epoch_across_ranks(tmp_path_factory, sizes, num_shards, shuffle, seed):
    folder = tmp_path_factory.mktemp("ids") / "mds"
    expected = _write_ids(folder, sizes)
    snapshot = open_table(str(folder))
    assert snapshot.file_records == tuple(sizes)
    if num_shards > len(expected):
        return  # more ranks than rows is refused (tested with every format)
    seen = []
    for shard in range(num_shards):
        read = _read(snapshot, ["k"], shard, num_shards, shuffle, seed)
        assert read.num_rows == count_rows(snapshot).shard_rows(shard, num_shards)
        seen += read.column("k").to_pylist()
    assert sorted(seen) == expected


def test_an_mds_folder_feeds_the_training_pipeline(tmp_path):
    from keras_dl.config import DataConfig
    from keras_dl.data import make_splits

    config = DataConfig(
        table=str(FIXTURES / "arrays_zstd"),
        label="label",
        features=("fixed",),
        cache_dir=str(tmp_path / "copy"),  # data.cache_dir: a local copy of the decoded shards
        shuffle=True,
    )
    data = make_splits(config, batch_size=4, rank=1, world_size=2)
    assert data.snapshot.lineage["data.format"] == "mds"
    assert data.train.stats.rows == 9 and data.train.rows == 4  # rank 1 of 2: rows 5..8
    batches = list(data.train.dataset.take(data.train.steps))  # one epoch (it repeats)
    assert [tuple(x.shape) for x, _, _ in batches] == [(4, 6)] * data.train.steps
    assert sum(float(w.numpy().sum()) for _, _, w in batches) == data.train.rows


def test_an_mds_folder_on_s3_is_read_like_a_local_one(s3):
    from keras_dl.storage import filesystem

    fs, root = filesystem(s3.uri("mds"))
    for path in (FIXTURES / "compressed_br").iterdir():
        with fs.open_output_stream(f"{root}/{path.name}") as out:
            out.write(path.read_bytes())
    snapshot = open_table(s3.uri("mds"))
    assert snapshot.uri == s3.uri("mds") and snapshot.format == "mds"
    local = open_table(str(FIXTURES / "compressed_br"))
    assert snapshot.lineage["data.version"] == local.lineage["data.version"]
    assert _read(snapshot).to_pylist() == _read(local).to_pylist()


def test_an_unhashed_shard_rewritten_in_place_is_decoded_again(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("KERAS_DL_MDS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "ids"
    _write_ids(folder, [3, 2])
    assert _read(open_table(str(folder)), ["k"]).column("k").to_pylist() == [0, 1, 2, 3, 4]
    shard = folder / "shard.00001.mds"
    data = bytearray(shard.read_bytes())
    data[-8:] = np.int64(40).tobytes()  # same size, same index.json, another value
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(1, 1))
    assert _read(open_table(str(folder)), ["k"]).column("k").to_pylist() == [0, 1, 2, 3, 40]


@pytest.mark.slow
def test_a_recipe_trains_on_an_mds_folder(tmp_path):
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    recipe = load_recipe("tabular")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={FIXTURES / 'scalars'}",
            "data.label=f64",
            "data.features=f32,i16,u8",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "train.epochs=1",
            "train.verbose=0",
        ],
    )
    result = fit(exp, recipe)
    assert result.run_id
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tags = mlflow.get_run(result.run_id).data.tags
    assert tags["data.format"] == "mds" and tags["data.version"].startswith("shards-sha256-")


def test_decoded_versions_unused_for_days_are_deleted_and_used_ones_kept(tmp_path, monkeypatch):
    """Decoded copies were never cleaned up: every version of every dataset stayed."""
    import os
    import time

    from keras_dl.data.tables.mds_cache import STAMP

    cache = tmp_path / "cache"
    monkeypatch.setenv("KERAS_DL_MDS_CACHE", str(cache))
    monkeypatch.setenv("KERAS_DL_MDS_CACHE_DAYS", "7")
    old, recent = cache / "shards-sha256-old", cache / "shards-sha256-recent"
    for folder, days in ((old, 8), (recent, 6)):
        folder.mkdir(parents=True)
        (folder / "000000.parquet").write_bytes(b"x")
        (folder / STAMP).touch()
        then = time.time() - days * 86400
        os.utime(folder / STAMP, (then, then))
    snapshot = open_table(str(FIXTURES / "compressed_gz"))
    assert not old.exists()  # unused for 8 days
    assert recent.exists()  # 6 days: kept
    mine = Path(snapshot.files[0]).parent
    assert mine.parent == cache and (mine / STAMP).stat().st_mtime > time.time() - 60
    # Reopened: the same files, and the stamp renewed.
    assert open_table(str(FIXTURES / "compressed_gz")).files == snapshot.files


def test_the_default_cache_is_spelled_keras_dash_dl_and_the_old_one_goes(tmp_path, monkeypatch):
    monkeypatch.delenv("KERAS_DL_MDS_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    old = tmp_path / ".cache" / "keras_dl" / "mds" / "shards-sha256-x"
    old.mkdir(parents=True)
    snapshot = open_table(str(FIXTURES / "compressed_gz"))
    assert Path(snapshot.files[0]).parents[1] == tmp_path / ".cache" / "keras-dl" / "mds"
    assert not old.exists()


def _age(folder, days):
    import os
    import time

    from keras_dl.data.tables.mds_cache import STAMP

    then = time.time() - days * 86400
    os.utime(folder / STAMP, (then, then))


def test_a_copy_in_use_is_kept_however_old_its_stamp_and_goes_once_released(tmp_path):
    """A run reading one version for longer than the days (no reopen) lost it under itself."""
    from keras_dl.data.tables import mds_cache

    root = tmp_path / "cache"
    held = Path(mds_cache.use(str(root), "shards-sha256-held"))
    try:
        (held / "000000.parquet").write_bytes(b"x")
        _age(held, 30)
        mds_cache.use(str(root), "shards-sha256-other")  # an open of another version evicts
        assert (held / "000000.parquet").exists()  # held (a shared flock): in use, kept
    finally:
        mds_cache.release(str(held))
    mds_cache.release(str(root / "shards-sha256-other"))
    mds_cache.use(str(root), "shards-sha256-other")
    assert not held.exists()  # released and unused for 30 days: gone
    assert not [p for p in root.iterdir() if p.name.startswith(mds_cache.EVICTED)]
    mds_cache.release(str(root / "shards-sha256-other"))


def test_an_open_that_waits_on_an_eviction_makes_its_folder_anew(tmp_path):
    """The evictor locks, renames the folder aside and deletes it: an open blocked meanwhile
    must not return the renamed folder (its files about to go) but a fresh one at the path."""
    import fcntl
    import os
    import threading

    from keras_dl.data.tables import mds_cache

    root = tmp_path / "cache"
    folder = root / "shards-sha256-v"
    folder.mkdir(parents=True)
    (folder / "000000.parquet").write_bytes(b"stale")
    evictor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(evictor, fcntl.LOCK_EX)  # as _evict holds it
    got = {}
    opener = threading.Thread(
        target=lambda: got.update(folder=mds_cache.use(str(root), folder.name))
    )
    opener.start()
    opener.join(0.5)
    assert opener.is_alive()  # waits on the eviction's lock
    os.rename(folder, root / f"{mds_cache.EVICTED}v")
    os.close(evictor)  # the lock goes with it
    opener.join(30)
    try:
        assert got["folder"] == str(folder)
        assert folder.is_dir() and not (folder / "000000.parquet").exists()  # made anew
        fd = mds_cache._HELD[str(folder)]
        assert os.fstat(fd).st_ino == os.stat(folder).st_ino  # the lock is on the new one
        again = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: no eviction takes it
        finally:
            os.close(again)
    finally:
        mds_cache.release(str(folder))


def test_an_eviction_that_died_leaves_nothing_behind(tmp_path):
    from keras_dl.data.tables import mds_cache

    root = tmp_path / "cache"
    dead = root / f"{mds_cache.EVICTED}shards-sha256-x-0123"
    dead.mkdir(parents=True)
    (dead / "000000.parquet").write_bytes(b"x")
    mds_cache.use(str(root), "shards-sha256-y")
    try:
        assert not dead.exists()
        assert sorted(p.name for p in root.iterdir()) == ["shards-sha256-y"]
    finally:
        mds_cache.release(str(root / "shards-sha256-y"))


def test_a_size_bound_deletes_the_least_recently_used_copies_not_in_use(
    tmp_path, monkeypatch, caplog
):
    """The copies were bounded by age alone: a week of versions could fill the disk."""
    import logging

    from keras_dl.data.tables import mds_cache
    from keras_dl.errors import ConfigError

    root = tmp_path / "cache"
    held = Path(mds_cache.use(str(root), "shards-sha256-held"))
    try:
        for name, size, days in (("held", 600, 3), ("older", 600, 2), ("newer", 500, 1)):
            folder = root / f"shards-sha256-{name}"
            folder.mkdir(exist_ok=True)
            (folder / "000000.parquet").write_bytes(b"x" * size)
            (folder / mds_cache.STAMP).touch()
            _age(folder, days)
        monkeypatch.setenv(mds_cache.SIZE_ENV, "1.5e-6")  # 1,500 bytes; 1,700 are there
        mds_cache.use(str(root), "shards-sha256-opened")
        # The least recently used copy is in use (held), so the next one goes; then it fits.
        assert sorted(p.name for p in root.iterdir()) == [
            "shards-sha256-held",
            "shards-sha256-newer",
            "shards-sha256-opened",
        ]
        monkeypatch.setenv(mds_cache.SIZE_ENV, "1e-7")  # 100 bytes: only copies in use left
        with caplog.at_level(logging.WARNING, logger=mds_cache.__name__):
            mds_cache.use(str(root), "shards-sha256-opened")
        assert (held / "000000.parquet").exists() and not (root / "shards-sha256-newer").exists()
        assert mds_cache.SIZE_ENV in caplog.text and "in use" in caplog.text
        monkeypatch.setenv(mds_cache.SIZE_ENV, "lots")
        with pytest.raises(ConfigError, match=f"{mds_cache.SIZE_ENV}='lots' is not a number"):
            mds_cache.use(str(root), "shards-sha256-opened")
    finally:
        mds_cache.release(str(held))
        mds_cache.release(str(root / "shards-sha256-opened"))
    assert not [p for p in root.iterdir() if p.name.startswith(mds_cache.EVICTED)]
