"""Table formats, each turned into a :class:`~keras_dl.data.tables.snapshot.TableSnapshot`.

Only the modules here know a table format: ``delta`` (the Delta log), ``parquet`` (files,
folders, globs), ``petastorm_meta`` (a Petastorm dataset's Unischema, read without running
code) and ``mds`` (a Mosaic StreamingDataset folder, decoded by ``mds_shards``).
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.errors import DataError


def open_table(
    table: str | Sequence[str],
    version: int | None = None,
    timestamp: str | None = None,
    trust_petastorm_metadata: bool | None = None,
    since_version: int | None = None,
    since_timestamp: str | None = None,
) -> TableSnapshot:
    """Open a Delta table (latest, ``version`` or ``timestamp``), a Petastorm dataset, an MDS
    folder (an ``index.json`` at its root) or Parquet.

    A folder with a ``_delta_log`` is always read as Delta, or refused: never as the plain
    Parquet files it holds, which include removed files and rows deleted by deletion vectors.
    A Petastorm dataset's metadata is read without running code (see ``petastorm_meta``).

    Args:
        table: A Delta table path or URI; a Parquet directory; a glob; or a list (or
            comma-separated string) of Parquet files.
        version: Delta version to read. Defaults to the latest.
        timestamp: ISO 8601 timestamp for Delta time travel. Defaults to None.
        trust_petastorm_metadata: Unpickle a Petastorm dataset's Unischema with Petastorm's own
            loader, which can run code (``data.trust_petastorm_metadata``). Defaults to None:
            only data classes are loaded, unless inside ``petastorm_meta.trusting()``.
        since_version: Read only the rows added after this Delta version and still live at
            ``version`` (see ``changes``). Defaults to None (the whole table).
        since_timestamp: As ``since_version``, at the latest version committed at or before
            this ISO 8601 time. Defaults to None.

    Raises:
        DataError: When the table does not exist, cannot be listed, or cannot be read exactly.
    """
    from keras_dl.data.tables.delta import is_delta, open_delta
    from keras_dl.data.tables.mds import is_mds, open_mds
    from keras_dl.data.tables.parquet import open_parquet, open_parquet_files
    from keras_dl.storage import local_path, open_storage

    if isinstance(table, str) and "," in table:
        table = [t.strip() for t in table.split(",") if t.strip()]
    if not isinstance(table, str):
        _no_time_travel(table, version, timestamp, since_version, since_timestamp)
        return open_parquet_files(list(table))
    try:
        storage = open_storage(table)
        delta = is_delta(storage)
        mds = not delta and is_mds(storage)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(
            f"Table {table!r} cannot be listed ({exc}). Check the path or URI and, for object "
            "storage, the credentials and endpoint."
        ) from None
    if delta:
        if since_version is not None or since_timestamp:
            from keras_dl.data.tables.changes import open_changes

            return open_changes(storage, since_version, version, timestamp, since_timestamp)
        return open_delta(storage, version, timestamp)
    _no_time_travel(table, version, timestamp, since_version, since_timestamp)
    if mds:
        return open_mds(storage)
    local = local_path(table)
    if local is not None:
        from keras_dl.data.tables.petastorm import is_petastorm_dataset, open_petastorm

        if is_petastorm_dataset(local):
            return open_petastorm(table, trust=trust_petastorm_metadata)
    return open_parquet(table)


def _no_time_travel(table, version, timestamp, since=None, since_timestamp=None) -> None:
    if version is not None or timestamp or since is not None or since_timestamp:
        raise DataError(
            f"data.version/data.timestamp/data.since_version was given but {table!r} is not a Delta table (no "
            "_delta_log folder). Time travel needs Delta; drop the version for plain Parquet."
        )
