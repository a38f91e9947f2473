"""``pyarrow.filesystem``, ``pyarrow.localfs``, ``pyarrow.LocalFileSystem`` and ``pyarrow.hdfs``,
rebuilt on ``pyarrow.fs`` for Petastorm 0.13.1.

pyarrow 16 removed the legacy filesystem API, and Petastorm imports it at module level:

- ``petastorm/utils.py:23`` ``from pyarrow.filesystem import LocalFileSystem`` (so ``import
  petastorm`` fails);
- ``petastorm/spark/spark_dataset_converter.py:28`` ``from pyarrow import LocalFileSystem``;
- ``petastorm/hdfs/namenode.py:24`` ``from pyarrow.hdfs import HadoopFileSystem`` and ``:270``
  ``pyarrow.hdfs.connect(...)``;
- ``petastorm/fs_utils.py:88-89`` ``pyarrow.localfs`` (every ``file://`` dataset).

These are *new* names on pyarrow >= 16 (nothing else can have relied on them there), so
:func:`install` registers them process-wide, but only those that are missing: on pyarrow 12 it
does nothing. The classes cover the legacy API Petastorm calls (``open``, ``exists``, ``rm``,
``delete``, ``isdir``, ``ls``...) and pickle by reference to this module, so process-pool workers
and Spark executors rebuild them. HDFS is a thin wrapper over ``pyarrow.fs.HadoopFileSystem``;
it is not exercised here (no HDFS on this machine).
"""

from __future__ import annotations

import builtins
import importlib.util
import sys

import pyarrow as pa
import pyarrow.fs as pafs


class FileSystem:
    """The legacy ``pyarrow.filesystem.FileSystem`` methods Petastorm uses, on a ``pyarrow.fs``."""

    pathsep = "/"

    def __init__(self, arrow_fs: pafs.FileSystem) -> None:
        self.arrow_fs = arrow_fs

    def open(self, path, mode: str = "rb"):
        if "r" in mode:
            return self.arrow_fs.open_input_file(str(path))
        if "a" in mode:
            return self.arrow_fs.open_append_stream(str(path))
        return self.arrow_fs.open_output_stream(str(path))

    def exists(self, path) -> bool:
        return self.arrow_fs.get_file_info(str(path)).type != pafs.FileType.NotFound

    def isdir(self, path) -> bool:
        return self.arrow_fs.get_file_info(str(path)).type == pafs.FileType.Directory

    def isfile(self, path) -> bool:
        return self.arrow_fs.get_file_info(str(path)).type == pafs.FileType.File

    def ls(self, path) -> list[str]:
        return sorted(i.path for i in self.arrow_fs.get_file_info(pafs.FileSelector(str(path))))

    def mkdir(self, path, create_parents: bool = True) -> None:
        self.arrow_fs.create_dir(str(path), recursive=create_parents)

    def rm(self, path, recursive: bool = False) -> None:
        if self.isdir(path):
            if not recursive:
                raise OSError(f"{path} is a directory: pass recursive=True to delete it")
            self.arrow_fs.delete_dir(str(path))
        else:
            self.arrow_fs.delete_file(str(path))

    delete = rm

    def mv(self, path, new_path) -> None:
        self.arrow_fs.move(str(path), str(new_path))

    def cat(self, path) -> bytes:
        with self.open(path) as f:
            return f.read()

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.arrow_fs.equals(self.arrow_fs)

    def __hash__(self) -> int:
        return hash(type(self))


class LocalFileSystem(FileSystem):
    """``pyarrow.LocalFileSystem`` / ``pyarrow.localfs``: a file opened to read is the Arrow file
    every :class:`FileSystem` opens (seekable, like the legacy class's Python file, and a context
    manager); to write, Python's ``open``, as the legacy class did.

    Not a Python file to read: Arrow wraps a Python file's bytes in buffers whose release takes
    the interpreter's lock, and its decode threads (``use_threads``) can drop the last reference
    just after a read returns. When the process exits at that moment, the thread finds the
    interpreter finalizing and is ended by ``pthread_exit`` inside a C++ destructor: the process
    aborts with "terminate called without an active exception" after its work is done (a
    Petastorm reader stopped mid-read, then exit: 1 run in 374 on a loaded machine here, its
    core dump showing ``arrow::py::PyBuffer::~PyBuffer`` on a ``DecodeRowGroups`` thread). An
    Arrow file's buffers are Arrow's own.
    """

    _instance = None

    def __init__(self) -> None:
        super().__init__(pafs.LocalFileSystem())

    @classmethod
    def get_instance(cls) -> LocalFileSystem:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    _get_instance = get_instance

    def open(self, path, mode: str = "rb"):
        if mode == "rb":
            return super().open(path, mode)
        return builtins.open(str(path), mode)

    def __reduce__(self):
        return (LocalFileSystem, ())


class HadoopFileSystem(FileSystem):
    """``pyarrow.hdfs.HadoopFileSystem`` on ``pyarrow.fs.HadoopFileSystem`` (needs libhdfs)."""

    def __init__(self, host="default", port=0, user=None, kerb_ticket=None, driver="libhdfs",
                 extra_conf=None) -> None:  # fmt: skip
        self._args = (host, port, user, kerb_ticket, driver, extra_conf)
        super().__init__(
            pafs.HadoopFileSystem(
                host, port, user=user, kerb_ticket=kerb_ticket, extra_conf=extra_conf
            )
        )

    def __reduce__(self):
        return (HadoopFileSystem, self._args)


def connect(host="default", port=0, user=None, kerb_ticket=None, extra_conf=None, **_):
    """``pyarrow.hdfs.connect`` (removed in pyarrow 16); ``driver=`` is ignored (libhdfs only)."""
    return HadoopFileSystem(host, port, user=user, kerb_ticket=kerb_ticket, extra_conf=extra_conf)


def missing() -> list[str]:
    """The legacy names this pyarrow lacks: all four from pyarrow 16 on, none before.

    Before 16 pyarrow still serves ``localfs`` and ``LocalFileSystem`` through its module
    ``__getattr__`` (with a FutureWarning), so they are not probed one by one.
    """
    if importlib.util.find_spec("pyarrow.filesystem") is not None:
        return []
    return ["pyarrow.filesystem", "pyarrow.hdfs", "pyarrow.localfs", "pyarrow.LocalFileSystem"]


def install() -> list[str]:
    """Register the missing legacy names (pyarrow >= 16); returns them (empty on pyarrow 12)."""
    added = missing()
    this = sys.modules[__name__]
    for name in added:
        attr = name.split(".", 1)[1]
        if attr in ("filesystem", "hdfs"):
            # One module serves both: it has FileSystem/LocalFileSystem and HadoopFileSystem/connect.
            sys.modules[name] = this
            setattr(pa, attr, this)
        elif attr == "localfs":
            pa.localfs = LocalFileSystem.get_instance()
        else:
            pa.LocalFileSystem = LocalFileSystem
    return added
