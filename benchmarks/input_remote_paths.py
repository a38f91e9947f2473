"""The paths ``keras-dl bench input --store s3|azure`` measures, and the bytes each fetches.

- :func:`keras_dl`: one stream of keras_dl's reader at batch 256, ``data.cache=never``;
- :func:`scan`: a parallel ``pyarrow.dataset`` scan of the table's files on the store's own
  filesystem (``S3FileSystem`` or ``AzureFileSystem``, from the environment), pre-buffered;
- :func:`bytes_fetched`: the bytes one cold epoch of each fetched through the latency proxy,
  over the table's planned column chunks.
"""

from __future__ import annotations

from benchmarks import timing
from benchmarks.input_paths import consume_split

BATCH = 256


def keras_dl(snapshot, plan, io: int | None = None, training: bool = True):
    from keras_dl.data import ReadOptions, make_dataset

    extra = {} if io is None else {"io_concurrency": io}
    options = ReadOptions(BATCH, training=training, cache_max_bytes=0, **extra)
    split = make_dataset(snapshot, plan, options)
    if not training:
        return split
    return consume_split(split, BATCH)


def _store_files(snapshot):
    """The store's pyarrow filesystem (S3 or Azure, from the environment) and the table's
    files on it."""
    from keras_dl.storage import filesystem

    fs = filesystem(snapshot.files[0])[0]
    return fs, [filesystem(f)[1] for f in snapshot.files]


def _scan_dataset(snapshot):
    import pyarrow.dataset as ds

    fmt = ds.ParquetFileFormat(
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True)
    )
    fs, paths = _store_files(snapshot)
    return ds.dataset(paths, format=fmt, filesystem=fs)


def scan(snapshot) -> float:
    """Rows/s of a parallel pyarrow dataset scan of the table's files (every column)."""
    dataset = _scan_dataset(snapshot)
    return timing.timed_loop(lambda: sum(b.num_rows for b in dataset.to_batches()))


def bytes_fetched(proxy, snapshot, plan, cached) -> dict:
    """Bytes each path fetched for one cold epoch (footers and all), over the planned bytes;
    and what an epoch over ``cached`` (the snapshot reading ``data.cache_dir``) still fetched
    from the store (nothing, when epoch 2 is read from local disk alone)."""
    import pyarrow.parquet as pq

    from keras_dl.data.hooks import FileChunks

    fs, paths = _store_files(snapshot)
    planned = 0
    for index, path in enumerate(paths):
        meta = pq.read_metadata(path, filesystem=fs)
        chunks = FileChunks(snapshot, index, meta, plan.columns)
        planned += sum(chunks.bytes(rg) for rg in range(meta.num_row_groups))
    out: dict = {"planned": planned}
    for name, one_epoch in (
        ("keras_dl", lambda: _epoch(keras_dl(snapshot, plan, training=False))),
        ("keras_dl_io_off", lambda: _epoch(keras_dl(snapshot, plan, io=0, training=False))),
        ("pyarrow_scan", lambda: sum(b.num_rows for b in _scan_dataset(snapshot).to_batches())),
        ("keras_dl_disk_cache", lambda: _epoch(keras_dl(cached, plan, training=False))),
    ):
        before = proxy.counts()
        rows = one_epoch()
        after = proxy.counts()
        fetched = after["received"] - before["received"]
        out[name] = {
            "rows": rows,
            "fetched": fetched,
            "requests": after["requests"] - before["requests"],
            "fetched/planned": round(fetched / planned, 3),
        }
    return out


def _epoch(split) -> int:
    """Rows of one evaluation epoch (no next epoch read ahead), iterated."""
    rows = 0
    for element in split.dataset:
        first = element[0] if isinstance(element, tuple) else element
        rows += int(next(iter(first.values())).shape[0] if isinstance(first, dict) else len(first))
    return rows
