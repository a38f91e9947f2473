"""Every store path rides out an outage of half the run's lease, on S3 (moto) and Azure (Azurite).

Each case holds a short lease on the store (6 s on S3; 15 s, the least Azure grants, on Azure),
arms :class:`OutageProxy` to take the store away for half of it at the first request of the path
under test (a row group's read, a Petastorm reader's opening, a schema read, the cache's
copy, the Delta commit, a predict task's file), runs the path, and checks its result exactly:
every row once, the copy byte for byte, one commit in the Delta log. In process, no Spark, a
few rows.
"""

from __future__ import annotations

import contextlib
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keras_dl.runlock import AzureLease, S3Lease
from tests.azurite import _AZURE_ENV, ACCOUNT, KEY, AzureContainer
from tests.fixtures.s3 import point_aws_at
from tests.storage.outage_proxy import OutageProxy

LEASE = 6.0  # Azure's blob leases last 15 s at least: an AzureLease takes 15
ROWS = pa.table({"x": pa.array(range(40), pa.int64()), "y": pa.array([i / 2 for i in range(40)])})


class Store:
    """The environment pointed at a test server through an :class:`OutageProxy`, and a fresh
    bucket or container there."""

    def __init__(self, kind: str, request, monkeypatch):
        import uuid

        self.kind = kind
        if kind == "s3":
            server = request.getfixturevalue("s3_server")
            server.endpoint()
            self.proxy = OutageProxy(server.port)
            self.root = f"s3://{point_aws_at(self.proxy.url, monkeypatch)}"
            self.lease_class = S3Lease
        else:
            server = request.getfixturevalue("azurite_server").ensure()
            self.proxy = OutageProxy(server.port)
            for key in _AZURE_ENV:
                monkeypatch.delenv(key, raising=False)
            monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT)
            monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
            monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", f"{self.proxy.url}/{ACCOUNT}")
            container = AzureContainer(server, f"lake-{uuid.uuid4().hex[:10]}")
            container.client().create_container()  # straight to Azurite
            self.root = container.uri()
            self.lease_class = AzureLease

    def uri(self, path: str) -> str:
        return f"{self.root}/{path}"

    def out(self, trigger: str, method: str = "[A-Z]+", landed: bool = False) -> None:
        """The store goes away for half the lease at the next ``method`` request whose path (after
        the bucket or container) matches the regex ``trigger`` (which reaches the store, and
        whose reply is lost, with ``landed``)."""
        self.proxy.arm(rf"^{method} /[^ ]*?{trigger}", self.lease.lease_seconds / 2, landed)


@pytest.fixture(params=["s3", "azure"])
def store(request, monkeypatch):
    held = Store(request.param, request, monkeypatch)
    lease = held.lease = held.lease_class(held.uri("run"), lease_seconds=LEASE)
    lease.acquire()
    try:
        yield held
    finally:
        held.proxy.wait_back()
        with contextlib.suppress(Exception):
            lease.release()
        held.proxy.close()


def _table(store: Store) -> str:
    from keras_dl.data.ingest.datasets import write_table

    uri = store.uri("t")
    write_table(ROWS, uri, rows_per_group=10)
    return uri


def _petastorm_read(store: Store, tmp_path):
    """The Petastorm workers' load of each row group (footers read once, then the data)."""
    from keras_dl.data.stream.row_group_worker import row_group_loader
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.rows import open_file

    snapshot = open_table(_table(store))
    load = row_group_loader(snapshot, ("x", "y"), {})
    groups = [
        (i, g)
        for i in range(len(snapshot.files))
        for g in range(open_file(snapshot, i).metadata.num_row_groups)
    ]
    store.out(r"/t/part-")
    return pa.concat_tables([load(i, g) for i, g in groups]), ROWS


def _reader_open(store: Store, tmp_path):
    """Petastorm's reader of a shard's row groups: opening it reads each file's metadata."""
    from keras_dl.data.stream.planned_reader import open_reader
    from keras_dl.data.stream.shards import Piece
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.rows import open_file

    snapshot = open_table(_table(store))
    pieces = [
        Piece(i, g, None, md.row_group(g).num_rows)
        for i in range(len(snapshot.files))
        for md in [open_file(snapshot, i).metadata]
        for g in range(md.num_row_groups)
    ]
    store.out(r"/t/part-")
    reader = open_reader(snapshot, ("x", "y"), pieces, workers=1)
    try:
        return pa.concat_tables(list(reader)), ROWS
    finally:
        reader.stop()
        reader.join()


def _schema_read(store: Store, tmp_path):
    """A Parquet table's schema, read from its first file's footer."""
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.rows import load_row_group, open_file
    from keras_dl.storage import filesystem

    fs, path = filesystem(store.uri("p/a.parquet"))
    with fs.open_output_stream(path) as out:
        pq.write_table(ROWS, out, row_group_size=10)
    store.out(r"/p/a\.parquet", "GET")
    snapshot = open_table([store.uri("p/a.parquet")])
    pf = open_file(snapshot, 0)
    groups = range(pf.metadata.num_row_groups)
    return pa.concat_tables(load_row_group(snapshot, 0, pf, g, ("x", "y")) for g in groups), ROWS


def _cache_fill(store: Store, tmp_path):
    """The disk cache's copy of each file (``data.cache_dir``)."""
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.disk_copy import cache_files

    snapshot = open_table(_table(store))
    store.out(r"/t/part-")
    cached = cache_files(snapshot, str(tmp_path / "cache"), background=False)
    assert all("://" not in f for f in cached.files), cached.files
    return pa.concat_tables(pq.read_table(f) for f in cached.files), ROWS


def _delta_commit(store: Store, tmp_path):
    """deltalake's commit of an append (the files are written before)."""
    from keras_dl.data.ingest.datasets import write_table

    uri = _table(store)
    # The commit reaches the store, and its reply is lost: it must not be made again.
    store.out(r"/t/_delta_log/0*1\.json", "PUT", landed=True)
    report = write_table(ROWS, uri, mode="append", rows_per_group=10)
    assert report.version == 1
    _one_commit_each(store, "t", 2)
    return _read(uri), pa.concat_tables([ROWS, ROWS])


def _predict_writer(store: Store, tmp_path):
    """What a predict task writes (its Parquet files), then the driver's commit."""
    from keras_dl.data.ingest.spark_delta import _add_action, _file_writer, commit
    from keras_dl.storage import delta_storage_options

    uri = store.uri("scored")
    store.out(r"/scored/part-")
    manifest = list(_file_writer(uri, ROWS.schema, 1 << 20)(iter(ROWS.to_batches(10))))
    actions = [_add_action(r) for r in pa.Table.from_batches(manifest).to_pylist()]
    commit(uri, ROWS.schema, actions, "error", False, delta_storage_options(uri))
    _one_commit_each(store, "scored", 1)
    return _read(uri), ROWS


def _read(uri: str) -> pa.Table:
    from keras_dl.data.training_rows import read_table

    return read_table(uri).sort_by("x")


def _one_commit_each(store: Store, table: str, versions: int) -> None:
    from keras_dl.storage import open_storage

    names = sorted(n for n, _ in open_storage(store.uri(table)).list("_delta_log"))
    commits = [n for n in names if re.fullmatch(r"\d{20}\.json", n.rsplit("/", 1)[-1])]
    assert len(commits) == versions, names


PATHS = {
    "petastorm_read": _petastorm_read,
    "reader_open": _reader_open,
    "schema_read": _schema_read,
    "cache_fill": _cache_fill,
    "delta_commit": _delta_commit,
    "predict_writer": _predict_writer,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_store_path_rides_out_an_outage_of_half_the_lease(store, path, tmp_path):
    rows, expected = PATHS[path](store, tmp_path)
    seen = store.proxy.state()
    assert seen["fired"], f"no request matched {store.proxy.trigger}: {seen['requests']}"
    assert seen["refused"] >= 1, seen  # the outage turned the path away
    assert rows.sort_by("x").equals(expected.sort_by("x")), rows  # every row, once
