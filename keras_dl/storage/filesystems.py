"""Where bytes live: local paths and object-store URIs, opened through ``pyarrow.fs``.

Every path keras_dl takes (a table, ``runtime.run_dir``, ``data.cache_dir``, predict's output)
may be an object-store URI. S3 and S3-compatible stores (``s3://``) read their credentials and
endpoint from the standard environment, with no keras_dl setting: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``),
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``; ``http://`` is allowed for a local store) and
``AWS_PROFILE``. Azure Blob storage and ADLS Gen2 (``abfs://``, ``abfss://``) read theirs from
the standard Azure variables (:mod:`~keras_dl.storage.azure`). Other schemes (``gs://``,
``hdfs://``) go through ``pyarrow.fs`` as it knows them. ``file://`` URIs are local paths.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from keras_dl.errors import DataError
from keras_dl.storage import azure
from keras_dl.storage.retry import check_root, retrying

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
        infos = retrying(lambda: self.fs.get_file_info(selector), self.uri)
        for info in infos:
            if info.type == pafs.FileType.File:
                mtime = None if info.mtime_ns is None else info.mtime_ns // 1_000_000
                out.append((info.base_name, mtime))
        return out

    def is_dir(self, relative: str = "") -> bool:
        import pyarrow.fs as pafs

        info = retrying(lambda: self.fs.get_file_info(self.path(relative)), self.uri)
        return info.type == pafs.FileType.Directory

    def read_text(self, relative: str) -> str:
        def read():
            with self.fs.open_input_stream(self.path(relative)) as f:
                return f.read().decode("utf-8")

        return retrying(read, self.uri)

    def read_bytes(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of the file at ``path`` (a path on ``fs``, or a URI
        on it, as a deletion vector's file is named)."""
        path = self.strip(path)

        def read():
            with self.fs.open_input_file(path) as f:
                f.seek(offset)
                return f.read(length)

        return retrying(read, self.uri)

    def file_uri(self, path: str) -> str:
        """A URI (or absolute local path) for a path on ``fs``, as readers are given it."""
        scheme = self.uri.split("://", 1)[0] if "://" in self.uri else ""
        if azure.is_azure(self.uri):  # container/path -> abfss://container@account.../path
            return azure.uri_on(self.uri, path)
        return f"{scheme}://{path}" if scheme else path

    def strip(self, uri: str) -> str:
        """The path on ``fs`` of an absolute URI or local path."""
        if uri.startswith("file://"):
            return uri[len("file://") :]
        if azure.is_azure(uri):
            return azure.fs_path(uri)
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
    elif azure.is_azure(uri):
        azure.check_container(fs, uri)
    return Storage(fs, root.rstrip("/"), uri.rstrip("/"))


def check_bucket(fs, bucket: str, uri: str) -> None:
    """Fail early, naming the bucket and the variables, when a bucket cannot be reached.

    A bucket that answered once in this process is in an outage when it stops answering: the
    check is then retried (:mod:`keras_dl.storage.retry`). One never reached fails at once.

    Raises:
        StoreUnavailable: A bucket that answered before did not answer again in time.
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

    check_root(
        lambda: fs.get_file_info(bucket).type != pafs.FileType.NotFound,
        uri,
        (endpoint, bucket),
        lambda exc: (
            f"Bucket {bucket!r} of {uri!r} cannot be reached {where} ({exc}). Check "
            f"AWS_ENDPOINT_URL, AWS_REGION and the credentials (AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY are {creds})."
        ),
        f"Bucket {bucket!r} of {uri!r} does not exist {where}, or these credentials cannot "
        f"see it (AWS_ACCESS_KEY_ID is {creds}). Create the bucket, or fix the URI, "
        "AWS_ENDPOINT_URL or the credentials.",
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
    if azure.is_azure(uri):
        return azure.azure_filesystem(azure.account_of(uri)), azure.fs_path(uri)
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:
        raise DataError(
            f"{uri!r} names a filesystem pyarrow cannot open ({exc}). keras_dl reads local "
            "paths, s3:// (and S3-compatible stores), abfs:// and abfss:// (Azure) and the "
            "schemes pyarrow.fs knows."
        ) from None


def s3_endpoint() -> str | None:
    """The S3 endpoint of the environment: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str | None:
    """The region of the environment: ``AWS_REGION``, else ``AWS_DEFAULT_REGION``."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


# A store that stops answering is noticed within seconds (the AWS SDK's curl gives up on a
# request that receives nothing for REQUEST_TIMEOUT s), and keras_dl.storage.retry retries.
CONNECT_TIMEOUT, REQUEST_TIMEOUT = 2.0, 3.0


def s3_filesystem():
    """A ``pyarrow.fs.S3FileSystem`` from the standard AWS environment variables, with short
    connect and request timeouts (:data:`CONNECT_TIMEOUT`, :data:`REQUEST_TIMEOUT`)."""

    env = os.environ
    kwargs: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT,
        "request_timeout": REQUEST_TIMEOUT,
    }
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
    return _s3_filesystem(tuple(sorted(kwargs.items())))


@functools.lru_cache(maxsize=16)
def _s3_filesystem(settings: tuple) -> Any:
    """One ``S3FileSystem`` per set of settings, shared (it is thread-safe).

    A new one per call cost a reader about 34 ms each on a busy process (the constructor
    releases the interpreter lock and waits to take it back behind the decoding threads), and
    the first read of an epoch made 13: 0.44 of the 0.54 s it took to open (``keras-dl bench
    input --store s3``). The settings include the credentials, so new ones get a new one.
    """
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(**dict(settings))


def local_path(uri: str) -> str | None:
    """The local path of ``uri``, or None for a remote URI."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def file_url(path: str) -> str:
    """A URL Petastorm accepts for a local path or remote URI."""
    # Not Path.as_uri(): it percent-encodes "=" in partition folders, which Petastorm keeps.
    return path if "://" in path else "file://" + os.path.abspath(path)
