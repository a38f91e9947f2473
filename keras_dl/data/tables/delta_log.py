"""Replay a Delta table's transaction log up to one version, as the Delta protocol says.

The state at version ``v`` is the newest complete checkpoint at or before ``v`` (classic,
multi-part, or a v2 UUID-named checkpoint with its sidecars), followed by every JSON commit
after it up to ``v``, with ``add`` and ``remove`` reconciled on the logical file key
``(path, deletion vector id)``. A gap in the commits (removed by log cleanup) is an error: the
version cannot be reconstructed, and reading anything else would return wrong rows.

Time travel by timestamp uses each commit's in-commit timestamp when present, else its
``commitInfo.timestamp``, else the commit file's modification time. A time after the last
commit is refused, as Delta's readers do: a commit still to come could change what it reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import unquote

from keras_dl.errors import DataError
from keras_dl.storage import Storage

LOG = "_delta_log"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTI = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")


@dataclass
class LogState:
    """A table's protocol, metadata and live files at one version."""

    version: int
    protocol: dict
    metadata: dict
    adds: list[dict] = field(default_factory=list)  # the live ``add`` actions, in log order
    timestamp_ms: int | None = None  # when ``version`` was committed


@dataclass
class _Listing:
    commits: dict[int, tuple[str, int | None]]  # version -> (file name, mtime ms)
    checkpoints: dict[int, list[list[str]]]  # version -> candidate checkpoints (their files)


def replay(storage: Storage, version: int | None = None, timestamp: str | None = None) -> LogState:
    """The table's state at ``version``, at the latest commit at or before ``timestamp``, or at
    its latest version.

    Raises:
        DataError: When the log is missing or has gaps, the version does not exist, or no
            version was committed at or before the timestamp, or the timestamp is after the
            last commit (Delta's own readers refuse it too).
    """
    listing = _list_log(storage)
    available = sorted(set(listing.commits) | set(listing.checkpoints))
    if not available:
        raise DataError(
            f"{storage.uri!r} has a {LOG} folder with no commit in it, so it is not a readable "
            "Delta table. Write the table again, or restore its _delta_log."
        )
    latest = max(available)
    if timestamp is not None:
        version = _version_at(storage, listing, timestamp)
    target = latest if version is None else version
    if version is not None and not (
        0 <= version <= latest and (version in listing.commits or version in listing.checkpoints)
    ):
        raise DataError(
            f"Delta table {storage.uri!r} has no version {version}: its versions run from "
            f"{min(available)} to {latest} (older ones may have been removed by log cleanup). "
            "Set data.version to one of them, or drop it to read the latest."
        )
    actions, start = _checkpoint_actions(storage, listing, target)
    missing = [v for v in range(start, target + 1) if v not in listing.commits]
    if missing:
        raise DataError(
            f"Delta table {storage.uri!r} cannot be read at version {target}: the commit(s) "
            f"{missing[:5]} are missing from {LOG} and no checkpoint covers them (log cleanup "
            "removed them). Read a later version, one at or after a checkpoint."
        )
    state = LogState(version=target, protocol={}, metadata={})
    live: dict[tuple, dict] = {}
    _apply(state, live, actions)
    for v in range(start, target + 1):
        _apply(state, live, _read_json_actions(storage, f"{LOG}/{listing.commits[v][0]}"))
    if not state.metadata or not state.protocol:
        raise DataError(
            f"Delta table {storage.uri!r} at version {target} has no "
            f"{'metaData' if not state.metadata else 'protocol'} action: its log is damaged."
        )
    state.adds = list(live.values())
    if target in listing.commits:
        state.timestamp_ms = _commit_time(storage, listing, target)
    return state


def file_key(action: dict) -> tuple[str, str | None]:
    """The logical file key of an add or remove: its decoded path and deletion-vector id."""
    dv = action.get("deletionVector") or None
    dv_id = None
    if dv:
        dv_id = f"{dv.get('storageType')}{dv.get('pathOrInlineDv')}"
        if dv.get("offset") is not None:
            dv_id += f"@{dv['offset']}"
    return unquote(action["path"]), dv_id


def commit_times(storage: Storage) -> dict[int, int]:
    """Every listed commit's version -> commit time (ms since the epoch)."""
    listing = _list_log(storage)
    return {v: _commit_time(storage, listing, v) for v in sorted(listing.commits)}


def version_at(storage: Storage, timestamp: str) -> int:
    """The latest version committed at or before ``timestamp`` (see :func:`replay`)."""
    return _version_at(storage, _list_log(storage), timestamp)


def commit_actions(storage: Storage, first: int, last: int) -> dict[int, list[dict]]:
    """The actions of the JSON commits ``first`` to ``last`` (both included), by version.

    Raises:
        DataError: Naming the versions whose JSON commit is missing (a history kept only as a
            checkpoint, or commits removed by log cleanup): their changes cannot be known.
    """
    listing = _list_log(storage)
    missing = [v for v in range(first, last + 1) if v not in listing.commits]
    if missing:
        raise DataError(
            f"Delta table {storage.uri!r} cannot say what changed in versions {first} to {last}: "
            f"the commit(s) {missing[:5]} are not in {LOG} (only a checkpoint or nothing covers "
            "them; log cleanup removed them). Set data.since_version to a version at or after "
            f"{max(missing)}, or read the whole table without it."
        )
    return {
        v: _read_json_actions(storage, f"{LOG}/{listing.commits[v][0]}")
        for v in range(first, last + 1)
    }


def _apply(state: LogState, live: dict, actions: list[dict]) -> None:
    for action in actions:
        if "add" in action:
            live[file_key(action["add"])] = action["add"]
        elif "remove" in action:
            live.pop(file_key(action["remove"]), None)
        elif "metaData" in action:
            state.metadata = action["metaData"]
        elif "protocol" in action:
            state.protocol = action["protocol"]


def _list_log(storage: Storage) -> _Listing:
    commits: dict[int, tuple[str, int | None]] = {}
    parts: dict[tuple[int, int], dict[int, str]] = {}
    checkpoints: dict[int, list[list[str]]] = {}
    for name, mtime in storage.list(LOG):
        if m := _COMMIT.match(name):
            commits[int(m.group(1))] = (name, mtime)
        elif m := _CLASSIC.match(name) or _UUID.match(name):
            checkpoints.setdefault(int(m.group(1)), []).append([name])
        elif m := _MULTI.match(name):
            parts.setdefault((int(m.group(1)), int(m.group(3))), {})[int(m.group(2))] = name
    for (v, total), found in parts.items():
        if len(found) == total:  # a multi-part checkpoint counts only when every part is there
            checkpoints.setdefault(v, []).append([found[i] for i in sorted(found)])
    return _Listing(commits, checkpoints)


def _checkpoint_actions(storage: Storage, listing: _Listing, target: int) -> tuple[list, int]:
    """The actions of the newest readable checkpoint at or before ``target`` and the first
    commit to replay after it (0 without a checkpoint)."""
    for v in sorted((c for c in listing.checkpoints if c <= target), reverse=True):
        for files in listing.checkpoints[v]:
            try:
                actions = []
                for name in files:
                    actions += _read_checkpoint_file(storage, name)
            except Exception:
                continue  # a partly written checkpoint: try an older one, as Delta readers do
            return actions, v + 1
    return [], 0


def _read_checkpoint_file(storage: Storage, name: str) -> list[dict]:
    actions = (
        _read_json_actions(storage, f"{LOG}/{name}")
        if name.endswith(".json")
        else _read_parquet_actions(storage, f"{LOG}/{name}")
    )
    sidecars = [a["sidecar"] for a in actions if a.get("sidecar")]
    for sidecar in sidecars:  # v2 checkpoints may keep their file actions in sidecar files
        path = sidecar["path"]
        relative = unquote(path) if "/" in path else f"{LOG}/_sidecars/{unquote(path)}"
        actions += _read_parquet_actions(storage, relative)
    return actions


def _read_parquet_actions(storage: Storage, relative: str) -> list[dict]:
    import pyarrow.parquet as pq

    from keras_dl.storage.retry import retrying

    path = storage.path(relative)
    table = retrying(
        lambda: pq.read_table(path, filesystem=storage.fs, page_checksum_verification=True),
        storage.uri,
    )
    out = []
    for name in ("add", "remove", "metaData", "protocol", "sidecar"):
        if name not in table.column_names:
            continue
        for value in table.column(name).to_pylist():
            if value is not None:
                out.append({name: _maps_to_dicts(value)})
    return out


def _maps_to_dicts(value):
    """Parquet MAP columns arrive as lists of (key, value) pairs: make them dicts again."""
    if isinstance(value, dict):
        return {k: _maps_to_dicts(v) for k, v in value.items()}
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return {k: v for k, v in value}
    return value


def _read_json_actions(storage: Storage, relative: str) -> list[dict]:
    try:
        text = storage.read_text(relative)
    except Exception as exc:
        raise DataError(
            f"Delta log file {storage.path(relative)!r} cannot be read: {exc}"
        ) from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise DataError(
                    f"Delta log file {storage.path(relative)!r} line {n} is not JSON: the commit "
                    "is damaged. Restore it, or read an earlier data.version."
                ) from None
    return out


def _commit_time(storage: Storage, listing: _Listing, version: int) -> int:
    name, mtime = listing.commits[version]
    for action in _read_json_actions(storage, f"{LOG}/{name}"):
        info = action.get("commitInfo")
        if info:
            stamp = info.get("inCommitTimestamp") or info.get("timestamp")
            if stamp is not None:
                return int(stamp)
    return int(mtime or 0)


def _version_at(storage: Storage, listing: _Listing, timestamp: str) -> int:
    try:
        when = datetime.fromisoformat(timestamp)
    except ValueError:
        raise DataError(
            f"data.timestamp={timestamp!r} is not an ISO 8601 timestamp (for example "
            "2026-11-21T10:00:00+00:00)."
        ) from None
    if when.tzinfo is None:  # a naive time is read as UTC, as Delta's commit times are
        when = when.replace(tzinfo=timezone.utc)
    wanted = when.timestamp() * 1000
    times = {v: _commit_time(storage, listing, v) for v in sorted(listing.commits)}
    last = max(times)
    if wanted > times[last]:  # as Delta's own readers: not silently the latest version
        at = datetime.fromtimestamp(times[last] / 1000, timezone.utc).isoformat()
        raise DataError(
            f"Delta table {storage.uri!r} has no version at {timestamp}: that is after its last "
            f"commit (version {last}, committed at {at}), and a later commit could still "
            f"change what that time reads. Use a data.timestamp at or before {at}, or drop "
            "data.timestamp to read the latest version."
        )
    before = [v for v, t in times.items() if t <= wanted]
    if not before:
        first = min(times)
        at = datetime.fromtimestamp(times[first] / 1000, timezone.utc).isoformat()
        raise DataError(
            f"Delta table {storage.uri!r} has no version at or before {timestamp}: its first "
            f"available version ({first}) was committed at {at}. Use a later data.timestamp or "
            "a data.version."
        )
    return max(before)
