"""Fetch a remote shard's row groups ahead of the decoders, in the order they are planned.

On an object store every request waits a round trip before its first byte. Without this, each
of Petastorm's workers reads one row group at a time: it opens the file (a HEAD request for its
size), then reads the row group's chunks (one request, pyarrow pre-buffering them), so a reader
keeps at most ``data.workers`` requests in flight and waits two round trips per row group.
:class:`RowGroupPrefetch` hides that latency without more decoding threads:

- it walks the shard's pieces in their planned order (the order Petastorm ventilates them) and
  fetches each row group's planned column chunks (:class:`~keras_dl.data.tables.chunks.FileChunks`)
  as a few coalesced range requests (:func:`~keras_dl.storage.ranges.coalesce`);
- its own pool of ``concurrency`` I/O threads keeps that many requests in flight (they wait on
  the network with the interpreter lock released), and it stops fetching ahead while
  ``max_bytes`` bytes are requested and not yet decoded (one row group larger than that is
  fetched alone);
- each file's footer is fetched once, ahead, by the same pool, and kept with the file's size
  for the next epochs' prefetches of the same snapshot (:func:`opened_files`): an epoch after
  the first starts with its first range request, not with two round trips (the size, then the
  footer) per file.

A worker takes its row group with :meth:`RowGroupPrefetch.fetched`: a file object serving the
fetched bytes, and the file's footer. Which rows are read, and in which order, stays the plan's:
the fetched bytes are the very bytes the worker would have read. Anything the prefetch did not
fetch (or failed to) is read from the store the ordinary way, retried as before.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.parquet as pq

from keras_dl.data.stream.shards import Piece
from keras_dl.data.tables.chunks import FileChunks
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.storage import filesystem, local_path
from keras_dl.storage.ranges import RangeFile, coalesce
from keras_dl.storage.retry import retrying

FOOTER_BYTES = 64 << 10  # the file's tail fetched for its footer, as pyarrow reads it
KEPT_FILES = 4096  # per snapshot: the opened files (size, footer) kept for the next epochs


def open_prefetch(
    snapshot: TableSnapshot,
    columns: Sequence[str],
    pieces: Sequence[Piece],
    concurrency: int,
    max_bytes: int,
) -> RowGroupPrefetch | None:
    """A started prefetch of ``pieces`` when they are on an object store and ``concurrency``
    is above 0; None otherwise (local files are read in place)."""
    if concurrency < 1 or not pieces:
        return None
    if all(local_path(snapshot.files[p.file]) is not None for p in pieces):
        return None
    return RowGroupPrefetch(snapshot, columns, pieces, concurrency, max_bytes)


@dataclass
class _File:
    handle: object  # a pyarrow RandomAccessFile (read_at is thread-safe)
    size: int
    meta: object  # its pyarrow.parquet.FileMetaData
    chunks: FileChunks


@dataclass
class _Entry:
    nbytes: int
    file: _File | None = None
    parts: list[Future] | None = None  # one future (offset, bytes) per range


_OPENED: dict[int, tuple[weakref.ref, dict]] = {}
_opened_lock = threading.Lock()


def opened_files(snapshot: TableSnapshot) -> dict[tuple[int, tuple[str, ...]], _File]:
    """The files prefetches of ``snapshot`` opened (``(file index, columns)`` -> handle, size,
    footer, planned chunks), shared by the prefetches of every epoch while the snapshot lives.

    A snapshot is one version of the table, as a run reads it: its files are the ones it names
    for as long as it is read (Delta never rewrites a data file; a plain Parquet file rewritten
    in place mid-run already breaks the plan cut from its footer). A new snapshot (the next run,
    or the next version) opens its files again.
    """
    key = id(snapshot)
    with _opened_lock:
        kept = _OPENED.get(key)
        if kept is not None and kept[0]() is snapshot:
            return kept[1]
        files: dict = {}
        ref = weakref.ref(snapshot, lambda _, key=key: _forget(key))
        _OPENED[key] = (ref, files)
        return files


def _forget(key: int) -> None:
    with _opened_lock:
        kept = _OPENED.get(key)
        if kept is not None and kept[0]() is None:
            del _OPENED[key]


class RowGroupPrefetch:
    """The planned row groups' column chunks, fetched ahead in planned order (see the module).

    Attributes:
        fetched_bytes: Bytes received (footers, ranges, reads outside them).
        requests: Range requests made (file opens not counted).
        peak_bytes: The most bytes requested and not yet decoded at any time.
    """

    def __init__(self, snapshot, columns, pieces: Sequence[Piece], concurrency, max_bytes):
        self.snapshot, self.columns = snapshot, tuple(columns)
        self.order = [(p.file, p.row_group) for p in pieces]
        self.position = {key: i for i, key in enumerate(self.order)}
        self.concurrency, self.max_bytes = concurrency, max_bytes
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="keras_dl-io")
        self.cond = threading.Condition()
        self.entries: dict[tuple[int, int], _Entry] = {}  # scheduled, not yet taken
        self.files: dict[int, Future] = {}
        self.opened = opened_files(snapshot)  # earlier epochs' opens of this snapshot's files
        self.held = 0  # bytes requested and not yet released by a decoder
        self.next = 0  # the position in ``order`` the scheduler is at
        self.closed = False
        self.fetched_bytes = self.requests = self.peak_bytes = 0
        self.thread = threading.Thread(target=self._schedule, name="keras_dl-io-plan", daemon=True)
        self.thread.start()

    @contextlib.contextmanager
    def fetched(self, index: int, row_group: int) -> Iterator[tuple[RangeFile, object] | None]:
        """``(file object, footer)`` of a fetched row group, or None: read it the ordinary way.
        Its bytes count against ``max_bytes`` until the block ends (the decoding is done)."""
        key = (index, row_group)
        with self.cond:
            while not self.closed and key not in self.entries and self._ahead(key):
                self.cond.wait()
            entry = self.entries.pop(key, None)
        try:
            yield self._source(entry)
        finally:
            if entry is not None:
                with self.cond:
                    self.held -= entry.nbytes
                    self.cond.notify_all()

    @property
    def requested_all(self) -> bool:
        """Every planned row group is requested (or being read the ordinary way)."""
        return self.next >= len(self.order)

    def close(self) -> None:
        """Stop fetching; fetches under way finish on their own, their bytes dropped."""
        with self.cond:
            self.closed = True
            self.entries.clear()
            self.cond.notify_all()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _ahead(self, key) -> bool:
        """Whether the scheduler has yet to reach ``key`` (a key it passed is not coming)."""
        return self.position.get(key, -1) >= self.next

    def _source(self, entry: _Entry | None):
        if entry is None or entry.file is None:
            return None
        try:
            parts = [f.result() for f in entry.parts]
        except Exception:  # read the ordinary way: retried, and errors named as before
            return None
        file = entry.file
        return RangeFile(file.size, parts, lambda o, n: self._read(file, o, n)), file.meta

    def _schedule(self) -> None:
        """Walk the planned order, then, ended or failed, let every worker still waiting read
        its row group the ordinary way (none waits on a scheduler that is gone)."""
        try:
            self._walk()
        finally:
            with self.cond:
                self.next = len(self.order)
                self.cond.notify_all()

    def _walk(self) -> None:
        """Fetch each planned row group, in order, once the bytes budget has room."""
        opened = 0  # files (in order of first use) whose opening was submitted
        firsts = list(dict.fromkeys(index for index, _ in self.order))
        rank = {index: i for i, index in enumerate(firsts)}
        for i, key in enumerate(self.order):
            # Footers are fetched ahead too: of this file and the next ``concurrency`` ones.
            while opened < len(firsts) and opened <= rank[key[0]] + self.concurrency:
                self._submit_open(firsts[opened])
                opened += 1
            entry = self._plan(key)
            with self.cond:
                while not self.closed and self.held and self.held + entry.nbytes > self.max_bytes:
                    self.cond.wait()
                if self.closed:
                    return
                if entry.file is not None:
                    ranges = coalesce(entry.file.chunks.ranges(key[1]))
                    entry.parts = [self._submit(self._fetch, entry.file, r) for r in ranges]
                    self.held += entry.nbytes
                    self.peak_bytes = max(self.peak_bytes, self.held)
                self.entries[key] = entry
                self.next = i + 1
                self.cond.notify_all()

    def _plan(self, key) -> _Entry:
        try:
            file = self.files[key[0]].result()
            return _Entry(file.chunks.bytes(key[1]), file)
        except Exception:  # the worker opens it itself, and names the error
            return _Entry(0)

    def _submit(self, fn, *args) -> Future:
        try:
            return self.pool.submit(fn, *args)
        except RuntimeError as exc:  # the pool is shut down: closing
            failed: Future = Future()
            failed.set_exception(exc)
            return failed

    def _submit_open(self, index: int) -> None:
        file = self.opened.get((index, self.columns))
        if file is not None:
            self.files[index] = done = Future()
            done.set_result(file)  # opened by an earlier epoch: no round trip
            return
        self.files[index] = self._submit(self._open, index)

    def _open(self, index: int) -> _File:
        uri = self.snapshot.files[index]
        fs, path = filesystem(uri)
        handle = retrying(lambda: fs.open_input_file(path), uri)  # one HEAD: the file's size
        size = handle.size()
        n = min(size, FOOTER_BYTES)
        # The tail as pyarrow reads it (a footer above 64 KiB reads the rest through the
        # fallback), so the footer costs one request.
        tail = [(size - n, self._read_at(handle, size - n, n))]
        meta = pq.read_metadata(RangeFile(size, tail, lambda o, k: self._read_at(handle, o, k)))
        file = _File(handle, size, meta, None)
        file.chunks = FileChunks(self.snapshot, index, meta, self.columns)
        if len(self.opened) < KEPT_FILES:
            self.opened[(index, self.columns)] = file
        return file

    def _fetch(self, file: _File, span: tuple[int, int]) -> tuple[int, bytes]:
        offset, length = span
        return offset, self._read_at(file.handle, offset, length)

    def _read(self, file: _File, offset: int, length: int) -> bytes:
        return self._read_at(file.handle, offset, length)

    def _read_at(self, handle, offset: int, length: int) -> bytes:
        data = retrying(lambda: handle.read_at(length, offset), self.snapshot.uri)
        with self.cond:
            self.fetched_bytes += len(data)
            self.requests += 1
        return data
