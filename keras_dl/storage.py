"""Where bytes live: local paths and object-store URIs, opened through ``pyarrow.fs``.

Every path keras_dl takes (a table, ``runtime.run_dir``, ``data.cache_dir``, predict's output)
may be an object-store URI. S3 and S3-compatible stores (``s3://``) read their credentials and
endpoint from the standard environment, with no keras_dl setting: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``),
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``; ``http://`` is allowed for a local store) and
``AWS_PROFILE``. Other schemes (``gs://``, ``hdfs://``) go through ``pyarrow.fs`` as it knows
them. ``file://`` URIs are local paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from keras_dl.errors import DataError

S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True)
class Storage:
    """A filesystem and the root path of one table (or folder) on it."""

    fs: Any  # pyarrow.fs.FileSystem
    root: str  # the root on ``fs`` (no scheme)
    uri: str  # as users name it: an absolute local path, or the URI

    def path(self, relative: str) -> str:
        """The path on ``fs`` of a file named relative to the root."""
        return f"{self.root.rstrip('/')}/{relative}" if relative else self.root

    def list(self, relative: str = "") -> list[tuple[str, int | None]]:
        """``(name, mtime_ms)`` of the files directly in a folder (none when it is missing)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path(relative), allow_not_found=True)
        out = []
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                mtime = None if info.mtime_ns is None else info.mtime_ns // 1_000_000
                out.append((info.base_name, mtime))
        return out

    def is_dir(self, relative: str = "") -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path(relative)).type == pafs.FileType.Directory

    def read_text(self, relative: str) -> str:
        with self.fs.open_input_stream(self.path(relative)) as f:
            return f.read().decode("utf-8")

    def read_bytes(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of the file at ``path`` (a path on ``fs``)."""
        with self.fs.open_input_file(path) as f:
            f.seek(offset)
            return f.read(length)

    def file_uri(self, path: str) -> str:
        """A URI (or absolute local path) for a path on ``fs``, as readers are given it."""
        scheme = self.uri.split("://", 1)[0] if "://" in self.uri else ""
        return f"{scheme}://{path}" if scheme else path

    def strip(self, uri: str) -> str:
        """The path on ``fs`` of an absolute URI or local path."""
        if uri.startswith("file://"):
            return uri[len("file://") :]
        return uri.split("://", 1)[1] if "://" in uri else uri


def open_storage(uri: str) -> Storage:
    """The filesystem and root of ``uri`` (a local path, ``file://`` or another URI)."""
    local = local_path(uri)
    if local is not None:
        import pyarrow.fs as pafs

        root = os.path.abspath(local)
        return Storage(pafs.LocalFileSystem(), root, root)
    fs, root = filesystem(uri)
    if uri.split("://", 1)[0] in S3_SCHEMES:
        check_bucket(fs, root.split("/", 1)[0], uri)
    return Storage(fs, root.rstrip("/"), uri.rstrip("/"))


def check_bucket(fs, bucket: str, uri: str) -> None:
    """Fail early, naming the bucket and the variables, when a bucket cannot be reached.

    Raises:
        DataError: For a missing bucket, missing or wrong credentials, or an unreachable endpoint.
    """
    import pyarrow.fs as pafs

    endpoint = s3_endpoint()
    where = f"at {endpoint}" if endpoint else "on AWS (no AWS_ENDPOINT_URL set)"
    creds = (
        "set"
        if os.environ.get("AWS_ACCESS_KEY_ID")
        else "not set (using AWS_PROFILE or the instance's role)"
    )
    try:
        found = fs.get_file_info(bucket).type != pafs.FileType.NotFound
    except Exception as exc:
        raise DataError(
            f"Bucket {bucket!r} of {uri!r} cannot be reached {where} ({exc}). Check "
            f"AWS_ENDPOINT_URL, AWS_REGION and the credentials (AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY are {creds})."
        ) from None
    if not found:
        raise DataError(
            f"Bucket {bucket!r} of {uri!r} does not exist {where}, or these credentials cannot "
            f"see it (AWS_ACCESS_KEY_ID is {creds}). Create the bucket, or fix the URI, "
            "AWS_ENDPOINT_URL or the credentials."
        )


def filesystem(uri: str):
    """``(pyarrow filesystem, path on it)`` for a local path or a URI.

    A local path (or ``file://`` URI) gives the local filesystem and the absolute path; object
    stores take their credentials from the environment.
    """
    import pyarrow.fs as pafs

    local = local_path(uri)
    if local is not None:
        return pafs.LocalFileSystem(), os.path.abspath(local)
    scheme, _, rest = uri.partition("://")
    if scheme in S3_SCHEMES:
        return s3_filesystem(), rest
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:
        raise DataError(
            f"{uri!r} names a filesystem pyarrow cannot open ({exc}). keras_dl reads local "
            "paths, s3:// (and S3-compatible stores) and the schemes pyarrow.fs knows."
        ) from None


def s3_endpoint() -> str | None:
    """The S3 endpoint of the environment: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str | None:
    """The region of the environment: ``AWS_REGION``, else ``AWS_DEFAULT_REGION``."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def s3_filesystem():
    """A ``pyarrow.fs.S3FileSystem`` from the standard AWS environment variables."""
    import pyarrow.fs as pafs

    env = os.environ
    kwargs: dict[str, Any] = {}
    if env.get("AWS_ACCESS_KEY_ID"):
        kwargs.update(
            access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env.get("AWS_SECRET_ACCESS_KEY")
        )
        if env.get("AWS_SESSION_TOKEN"):
            kwargs["session_token"] = env["AWS_SESSION_TOKEN"]
    region = s3_region()
    if region:
        kwargs["region"] = region
    endpoint = s3_endpoint()
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs["endpoint_override"] = host.rstrip("/") if host else scheme
        if host:
            kwargs["scheme"] = scheme
    return pafs.S3FileSystem(**kwargs)


def delta_storage_options(uri: str) -> dict[str, str]:
    """deltalake's ``storage_options`` for ``uri``, from the same environment (empty if local).

    deltalake 1.x commits to S3 with conditional PUTs and has no DynamoDB lock, so no lock
    setting is passed (see :func:`check_safe_delta_writes`).
    """
    if local_path(uri) is not None or uri.split("://", 1)[0] not in S3_SCHEMES:
        return {}
    env = os.environ
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    out = {k: env[k] for k in keys if env.get(k)}
    region = s3_region()
    if region:
        out["AWS_REGION"] = region
    endpoint = s3_endpoint()
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    return out


def delta_row_group_options(rows_per_group: int) -> dict:
    """``write_deltalake`` keyword arguments for row groups of ``rows_per_group`` rows.

    deltalake 1.x writes with delta-rs' own Parquet writer: the row-group size is a writer
    property, and files are cut by bytes (delta-rs' ``target_file_size``), not by rows.
    """
    import deltalake

    return {"writer_properties": deltalake.WriterProperties(max_row_group_size=rows_per_group)}


def check_safe_delta_writes(uri: str) -> None:
    """Refuse a Delta write to S3 that could lose commits to a concurrent writer.

    deltalake 1.x commits with a conditional PUT (``If-None-Match``: the commit file is created
    only if absent), which S3 enforces, so it needs no lock. It dropped the DynamoDB lock and only
    logs that it ignores ``AWS_S3_LOCKING_PROVIDER=dynamodb``: a user who set it expects writers
    (Spark's ``S3DynamoDBLogStore``) to coordinate through it, which they would not, so the write
    is refused, naming the variable.

    Raises:
        DataError: Naming the table and the variable to unset.
    """
    if local_path(uri) is not None or uri.split("://", 1)[0] not in S3_SCHEMES:
        return
    if os.environ.get("AWS_S3_LOCKING_PROVIDER", "").lower() == "dynamodb":
        raise DataError(
            f"Writing the Delta table {uri!r}: AWS_S3_LOCKING_PROVIDER=dynamodb is set, but "
            "deltalake 1.x dropped the DynamoDB lock (it would ignore the setting). Its S3 "
            "commits are conditional writes, safe without a lock: unset "
            "AWS_S3_LOCKING_PROVIDER and DELTA_DYNAMO_TABLE_NAME (Spark writers using "
            "S3DynamoDBLogStore do not coordinate with it)."
        )


_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


def environment() -> dict[str, str]:
    """The object-store settings of this process's environment, to hand to Spark tasks.

    Executors may not share the driver's environment (a cluster, or Python workers started
    before the variables were set); tasks call :func:`use_environment` with this. MLflow's S3
    artifact store reads its endpoint from ``MLFLOW_S3_ENDPOINT_URL``: when that is unset, it is
    ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, so one endpoint setting serves both.
    """
    out = {k: os.environ[k] for k in (*_ENV, "MLFLOW_S3_ENDPOINT_URL") if os.environ.get(k)}
    endpoint = s3_endpoint()
    if endpoint and "MLFLOW_S3_ENDPOINT_URL" not in out:
        out["MLFLOW_S3_ENDPOINT_URL"] = endpoint
    return out


def use_environment(settings: dict[str, str]) -> None:
    """Apply the driver's object-store settings where this process has none of its own."""
    for key, value in settings.items():
        os.environ.setdefault(key, value)


def local_path(uri: str) -> str | None:
    """The local path of ``uri``, or None for a remote URI."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def file_url(path: str) -> str:
    """A URL Petastorm accepts for a local path or remote URI."""
    # Not Path.as_uri(): it percent-encodes "=" in partition folders, which Petastorm keeps.
    return path if "://" in path else "file://" + os.path.abspath(path)


def write_atomic(uri: str, data: bytes) -> None:
    """Write a whole file so that a reader sees either nothing or all of it.

    Local disks: a temporary file in the same folder, fsynced, renamed over the target, and the
    folder fsynced. Object stores: one PUT, which the store makes visible whole or not at all
    (there is no rename to lean on, and none is needed).
    """
    local = local_path(uri)
    if local is not None:
        folder = os.path.dirname(os.path.abspath(local))
        os.makedirs(folder, exist_ok=True)
        tmp = f"{local}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        fsync_dir(folder)
        return
    fs, path = filesystem(uri)
    with fs.open_output_stream(path) as f:
        f.write(data)


def read_file(uri: str) -> bytes:
    """A whole file's bytes (local path or URI)."""
    local = local_path(uri)
    if local is not None:
        with open(local, "rb") as f:
            return f.read()
    fs, path = filesystem(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def list_files(uri: str) -> dict[str, int]:
    """``{name: size}`` of the files directly in a folder (empty when it does not exist)."""
    storage = open_storage(uri)
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(storage.root, allow_not_found=True)
    return {
        i.base_name: i.size
        for i in storage.fs.get_file_info(selector)
        if i.type == pafs.FileType.File
    }


def remove(uri: str) -> None:
    """Delete a file if it exists."""
    local = local_path(uri)
    if local is not None:
        if os.path.exists(local):
            os.remove(local)
        return
    fs, path = filesystem(uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def join(uri: str, *names: str) -> str:
    """``uri/name/...`` for a local path or a URI."""
    if local_path(uri) is not None and "://" not in uri:
        return os.path.join(uri, *names)
    return "/".join([uri.rstrip("/"), *names])


def fsync_dir(folder: str) -> None:
    """Make a rename or a new file in ``folder`` durable (a no-op where folders can't be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
