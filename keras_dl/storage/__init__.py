"""Where bytes live: local paths and object-store URIs, behind one interface.

- :mod:`~keras_dl.storage.store`: :class:`Store`, one folder with atomic writes, reads,
  listings and removal, local or on an object store. Run folders use only this.
- :mod:`~keras_dl.storage.filesystems`: ``pyarrow.fs`` filesystems for a URI, the S3
  settings from the environment, and :class:`Storage`, a table's root for readers.
- :mod:`~keras_dl.storage.files`: the same whole-file operations by URI.
- :mod:`~keras_dl.storage.engines`: what deltalake and Spark tasks need to reach the store.
- :mod:`~keras_dl.storage.azure`: ``abfs://`` / ``abfss://`` URIs, the Azure account settings
  from the environment, and Azure's filesystem and blob clients.

Only this package asks whether a path is local or remote.
"""

from keras_dl.storage.azure import AZURE_SCHEMES, is_azure
from keras_dl.storage.engines import (
    check_safe_delta_writes,
    delta_row_group_options,
    delta_storage_options,
    environment,
    use_environment,
)
from keras_dl.storage.files import (
    disk_full_is_run_error,
    fsync_dir,
    join,
    list_files,
    read_file,
    remove,
    staged_output,
    write_atomic,
)
from keras_dl.storage.filesystems import (
    S3_SCHEMES,
    Storage,
    check_bucket,
    file_url,
    filesystem,
    local_path,
    open_storage,
    s3_endpoint,
    s3_filesystem,
    s3_region,
)
from keras_dl.storage.store import LocalStore, ObjectStore, Store, open_store, store_of

__all__ = [
    "AZURE_SCHEMES",
    "S3_SCHEMES",
    "LocalStore",
    "ObjectStore",
    "Storage",
    "Store",
    "check_bucket",
    "check_safe_delta_writes",
    "delta_row_group_options",
    "delta_storage_options",
    "disk_full_is_run_error",
    "environment",
    "file_url",
    "filesystem",
    "fsync_dir",
    "join",
    "list_files",
    "local_path",
    "open_storage",
    "open_store",
    "read_file",
    "remove",
    "s3_endpoint",
    "s3_filesystem",
    "s3_region",
    "staged_output",
    "is_azure",
    "store_of",
    "use_environment",
    "write_atomic",
]
