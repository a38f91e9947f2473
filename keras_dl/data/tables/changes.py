"""The rows a Delta table gained after one version: a change snapshot (``data.since_version``).

What is read, precisely: the rows that commits ``since+1`` to ``end`` (``data.version``, or the
latest) inserted, that are still in the table at ``end``. Each commit's change data is what the
Delta protocol ("Change Data Files") defines:

- a commit with ``cdc`` actions: its ``_change_data`` files. Rows whose ``_change_type`` is
  ``insert`` or ``update_postimage`` are inserted; ``delete`` and ``update_preimage`` rows are
  removed;
- a commit that only appends (no ``remove`` with ``dataChange``): its added files, less the rows
  their own deletion vectors delete;
- a commit that removes files with ``dataChange`` but wrote no change data: where
  ``delta.enableChangeDataFeed`` is on, its added files are inserted and its removed files
  (less their deletion vectors) are removed, as Delta's change-data readers do; where it is off,
  a :class:`~keras_dl.errors.DataError` naming the version and the operation, since rewritten
  files hold old rows beside the new ones.

A removed row cancels one equal row (same value in every column) inserted by the same commit
or an earlier one of the range, the newest first. So a row inserted and then deleted or updated in
the range is not read, an updated row is read once, in its last form, the unchanged rows a
rewrite copies into new files are not read, and neither is an update that changes nothing.
Removed rows that match no inserted row were older than the range and change nothing. Equal rows are interchangeable, so this is exact as a
multiset. The snapshot keeps each inserted file whole and masks the rows not read (the masks
deletion vectors use), so the row-exact shards, the reader and tf.data are unchanged.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from urllib.parse import unquote

import numpy as np

from keras_dl.data.tables.deletion_vectors import read_deletion_vector
from keras_dl.data.tables.delta import file_info, open_delta, parse_partition_value
from keras_dl.data.tables.delta_log import commit_actions, replay, version_at
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError
from keras_dl.storage import Storage

INSERTED = ("insert", "update_postimage")
REMOVED = ("delete", "update_preimage")
CDF = "delta.enableChangeDataFeed"


def open_changes(
    storage: Storage,
    since_version: int | None,
    version: int | None = None,
    timestamp: str | None = None,
    since_timestamp: str | None = None,
) -> TableSnapshot:
    """The rows inserted after ``since_version`` (or the version at ``since_timestamp``) and
    still live at ``version`` / ``timestamp`` (default: the latest), as a snapshot.

    Raises:
        DataError: Naming the versions for a bad range (negative, not before the end version,
            commits the log no longer has, a file vacuumed away), and naming the version and
            operation of a rewrite without change data.
    """
    end = open_delta(storage, version, timestamp)
    since = version_at(storage, since_timestamp) if since_timestamp else since_version
    if since is None or since < 0 or since >= end.version:
        given = (
            f" (the version at data.since_timestamp={since_timestamp})" if since_timestamp else ""
        )
        raise DataError(
            f"data.since_version={since}{given} does not name a range of Delta table "
            f"{storage.uri!r}: it must be at least 0 and before the version read ({end.version}"
            "). Set it to such a version (or read a later data.version), or drop it to read the "
            "whole table."
        )
    commits = commit_actions(storage, since + 1, end.version)
    config = dict(replay(storage, since).metadata.get("configuration") or {})
    events = []  # (version, "in" | "out", action, whether it is a change-data file)
    for v, actions in commits.items():
        for a in actions:
            if "metaData" in a:
                config = dict(a["metaData"].get("configuration") or {})
        events += _changes(storage.uri, v, actions, config.get(CDF, "false").lower() == "true")
    return _snapshot(storage, end, since, events)


def _changes(table: str, v: int, actions: list[dict], cdf: bool) -> list[tuple]:
    cdcs = [a["cdc"] for a in actions if "cdc" in a]
    if cdcs:
        return [(v, "in", c, True) for c in cdcs]
    adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
    removes = [
        a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)
    ]
    if removes and not cdf:
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        raise DataError(
            f"Delta table {table!r} version {v} ({info.get('operation', 'an unnamed operation')}) "
            f"rewrote {len(removes)} file(s) without change data ({CDF} is off then), so the rows "
            "it added cannot be told from the old rows its new files still hold. Set "
            f"data.since_version to {v} or later, or turn on {CDF} before such changes."
        )
    return [(v, "in", a, False) for a in adds] + [(v, "out", r, False) for r in removes]


def _snapshot(storage: Storage, end: TableSnapshot, since: int, events: list) -> TableSnapshot:
    """Read every changed file, cancel removed rows against inserted ones, mask the rest."""
    # Rows are compared by value only when something in the range removes rows.
    compare = any(kind == "out" or cdc for _, kind, _, cdc in events)
    live: dict[str, list[tuple[int, int]]] = defaultdict(list)  # row value -> (file, row)
    files, parts, kept, info = [], [], [], []
    for v in sorted({e[0] for e in events}):
        read = [
            (kind, action, *_read_rows(storage, end, action, kind, cdc, since, v, compare))
            for version, kind, action, cdc in events
            if version == v
        ]
        # A commit's inserts first...
        for kind, action, uri, values, rows, inserted, _ in read:
            if kind != "in":
                continue  # a removed file is only read for the rows it removes
            files.append(uri)
            parts.append(values)
            info.append(file_info(action))
            kept.append(np.zeros(rows, dtype=bool))
            for row, key in inserted:
                kept[-1][row] = True
                if key is not None:
                    live[key].append((len(files) - 1, row))
        # ...then its removals: they cancel the newest equal row, this commit's own first, so the
        # unchanged rows a rewrite copies into new files (remove + add) are not news.
        for _, _, _, _, _, _, removed in read:
            for key in removed:
                if live.get(key):
                    index, row = live[key].pop()
                    kept[index][row] = False
    masks = tuple(None if k.all() else np.flatnonzero(~k).astype(np.uint64) for k in kept)
    return replace(
        end,
        files=tuple(files),
        partitions=tuple(parts),
        deleted_rows=masks,
        file_records=tuple(len(k) for k in kept),
        # Change-data files carry no statistics: only row groups are skipped (by their footers).
        file_stats=(),
        file_info=tuple(info),
        since_version=since,
    )


def _read_rows(
    storage: Storage,
    end: TableSnapshot,
    action: dict,
    kind: str,
    cdc: bool,
    since: int,
    v: int,
    compare: bool,
):
    """Read one changed file: its URI, typed partition values, rows, the ``(row, key)`` of the
    rows it inserts and the keys of the rows it removes. A key is the row's value as JSON (None
    when ``compare`` is off); rows a deletion vector deleted count as neither."""
    import pyarrow.parquet as pq

    from keras_dl.storage.retry import retrying

    raw = unquote(action["path"])
    where = storage.strip(raw) if "://" in raw else storage.path(raw)
    physical = [end.physical_field(c).name for c in end.data_columns]
    wanted = (physical if compare else []) + (["_change_type"] if cdc else [])
    try:
        table = retrying(
            lambda: pq.read_table(where, columns=wanted, filesystem=storage.fs),
            storage.uri,
        )
    except Exception as exc:
        raise DataError(
            f"Delta table {storage.uri!r}: the changes of versions {since + 1} to {end.version} "
            f"need file {raw!r} (version {v}), which cannot be read ({exc}); VACUUM may have "
            f"removed it. Set data.since_version to a later version (up to {end.version - 1}), "
            "or read the whole table without it."
        ) from None
    values = {
        c: parse_partition_value(
            (action.get("partitionValues") or {}).get(_partition_key(end, c)),
            end.schema.field(c).type,
            c,
            storage.uri,
        )
        for c in end.partition_columns
    }
    n = table.num_rows
    live = np.ones(n, dtype=bool)
    dv = action.get("deletionVector")
    if dv:
        live[read_deletion_vector(dv, storage.uri, storage.read_bytes).astype(np.int64)] = False
    if cdc:
        types = np.asarray(table.column("_change_type").to_pylist(), dtype=object)
        ins, outs = live & np.isin(types, INSERTED), live & np.isin(types, REMOVED)
    elif kind == "in":
        ins, outs = live, np.zeros(n, dtype=bool)
    else:
        ins, outs = np.zeros(n, dtype=bool), live
    keys = [None] * n
    if compare:
        fixed = json.dumps([_plain(values[c]) for c in end.partition_columns])
        columns = [
            table.column(p).cast(end.schema.field(c).type).to_pylist()
            for p, c in zip(physical, end.data_columns, strict=True)
        ]
        keys = [
            fixed + json.dumps([_plain(col[i]) for col in columns]) if ins[i] or outs[i] else None
            for i in range(n)
        ]
    inserted = [(int(i), keys[i]) for i in np.flatnonzero(ins)]
    return storage.file_uri(where), values, n, inserted, [keys[i] for i in np.flatnonzero(outs)]


def _partition_key(end: TableSnapshot, column: str) -> str:
    return end.physical_field(column).name if end.physical_schema is not None else column


def _plain(value):
    """A value as comparable JSON: the same row from an add file and a change file is equal."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)
