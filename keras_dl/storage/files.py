"""Whole files by URI (a local path or an object-store URI): atomic writes, reads, listings."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator

from keras_dl.errors import RunError
from keras_dl.storage.azure import is_azure
from keras_dl.storage.filesystems import filesystem, local_path, open_storage
from keras_dl.storage.retry import retrying

_FULL = (errno.ENOSPC, errno.EDQUOT)  # a full filesystem, an exhausted quota


def write_atomic(uri: str, data: bytes) -> None:
    """Write a whole file so that a reader sees either nothing or all of it.

    Local disks: a temporary file in the same folder, fsynced, renamed over the target, and the
    folder fsynced. Object stores: one PUT, which the store makes visible whole or not at all
    (there is no rename to lean on, and none is needed).
    """
    local = local_path(uri)
    if local is not None:
        folder = os.path.dirname(os.path.abspath(local))
        tmp = f"{local}.{os.getpid()}.tmp"
        try:
            with disk_full_is_run_error(folder, os.path.basename(local), len(data)):
                os.makedirs(folder, exist_ok=True)  # a new folder takes a block too
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):  # a failed write leaves no partial file behind
                os.remove(tmp)
        fsync_dir(folder)
        return
    fs, path = filesystem(uri)
    with fs.open_output_stream(path) as f:
        f.write(data)


@contextlib.contextmanager
def disk_full_is_run_error(folder: str, name: str, size: int) -> Iterator[None]:
    """Turn a full disk (ENOSPC) or quota (EDQUOT) while writing ``name`` into ``folder`` into
    a :class:`~keras_dl.errors.RunError` naming the folder, the bytes needed and the fix."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        raise no_space_error(folder, name, size, exc.strerror or str(exc)) from exc


def no_space_error(folder: str, name: str, size: int, why: str = "No space left") -> RunError:
    """The :class:`~keras_dl.errors.RunError` of a write that did not fit in ``folder``."""
    try:
        free = f"{shutil.disk_usage(folder).free} bytes are free there"
    except OSError:
        free = "its free space is unknown"
    return RunError(
        f"The run folder {folder!r} is full ({why}): writing {name!r} needed {size} bytes, and "
        f"{free}. Nothing partial was left behind. Free space on that filesystem (or set "
        "runtime.run_dir to a folder on a disk with room), then run the same command again: "
        "it resumes from the last checkpoint."
    )


def read_file(uri: str) -> bytes:
    """A whole file's bytes (local path or URI)."""
    local = local_path(uri)
    if local is not None:
        with open(local, "rb") as f:
            return f.read()
    fs, path = filesystem(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


@contextlib.contextmanager
def staged_output(uri: str) -> Iterator:
    """A writable pyarrow file for ``uri``: the file itself on local disk; for an object store
    a local temporary file, uploaded whole when the block ends.

    The upload is retried through a store outage (:func:`~keras_dl.storage.retry.retrying`): a
    local copy can be sent again, a stream cut halfway cannot. Nothing is uploaded when the
    block raises, and the temporary file is removed either way.
    """
    import tempfile

    import pyarrow as pa

    fs, path = filesystem(uri)
    if local_path(uri) is not None:
        with fs.open_output_stream(path) as sink:
            yield sink
        return
    import pyarrow.fs as pafs

    fd, staged = tempfile.mkstemp(prefix="keras_dl-upload-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        with pa.OSFile(staged, "wb") as sink:
            yield sink
        local = pafs.LocalFileSystem()
        retrying(
            lambda: pafs.copy_files(
                staged, path, source_filesystem=local, destination_filesystem=fs
            ),
            uri,
        )
    finally:
        os.remove(staged)


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
    if is_azure(uri):
        import pyarrow.fs as pafs

        # pyarrow deletes an Azure blob of a flat-namespace account under a blob lease, and the
        # Azure SDK retries the lease of a missing blob for about 7 s before it says "missing".
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return
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
