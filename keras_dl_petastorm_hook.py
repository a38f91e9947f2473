"""The import hook that applies keras_dl's Petastorm compatibility layer wherever Petastorm is used.

Petastorm 0.13.1 (its last release) cannot be imported on pyarrow >= 16, reads with a legacy
``ParquetDataset`` pyarrow 15 removed, uses numpy names numpy 2 removed, and its thread pool can
end a read early or out of order. The fixes live in ``keras_dl.data.petastorm_compat``; they must
be in place *before* Petastorm's modules run, in every process that imports Petastorm: the
driver, Petastorm's process-pool workers, Spark's Python workers and Horovod ranks.

:func:`register` puts :class:`PetastormFinder` first on ``sys.meta_path``. It runs at interpreter
start from ``keras_dl_petastorm_compat.pth``, which the package installs into site-packages, and
on ``import keras_dl``. This is a top-level module, not part of the keras_dl package, so that the
.pth file does not import keras_dl into every Python process of the environment (pip included),
and a source checkout run with ``python -m`` still imports its own keras_dl.

It imports nothing but the standard library. The finder does nothing until a ``petastorm``
module is imported, or a legacy pyarrow name (``pyarrow.localfs``...) is asked for; only then
does it import the layer, from whichever keras_dl is on ``sys.path`` at that moment. The arrows
go one way: keras_dl imports this hook, this hook imports the layer, the layer imports neither.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading

# pyarrow removed these in 16; Petastorm reads them (the layer's filesystem.py puts them back).
_LEGACY_PYARROW_NAMES = ("filesystem", "hdfs", "localfs", "LocalFileSystem")


def register() -> None:
    """Put the Petastorm finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, PetastormFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PetastormFinder())


class PetastormFinder(importlib.abc.MetaPathFinder):
    """Load the layer before ``petastorm`` loads, and patch each ``petastorm.*`` module after."""

    def __init__(self) -> None:
        self._busy = threading.local()  # this thread's own lookups must not come back here

    def find_spec(self, fullname, path, target=None):
        if getattr(self._busy, "on", False):
            return None
        if fullname == "pyarrow":
            return _wrap(self._find(fullname, path, target), _after_pyarrow)
        if not (fullname == "petastorm" or fullname.startswith("petastorm.")):
            return None
        layer = self._call(_layer)
        self._call(layer.prepare)  # numpy aliases and pyarrow's names, before Petastorm's code runs
        return _wrap(self._find(fullname, path, target), layer.patch_module)

    def _find(self, fullname, path, target):
        """The spec the finders after this one give (sys.path, an editable install's...)."""
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _call(self, func, *args):
        self._busy.on = True
        try:
            return func(*args)
        finally:
            self._busy.on = False


def _layer():
    """keras_dl's compatibility layer, imported on first use (so from the keras_dl on sys.path)."""
    from keras_dl.data import petastorm_compat

    return petastorm_compat


def _after_pyarrow(pyarrow) -> None:
    """On pyarrow >= 16, serve its removed legacy names on first use (``pyarrow.localfs``).

    A Spark or pool worker may run Petastorm code pickled by value (the lambda using
    ``pyarrow.localfs`` in petastorm/fs_utils.py:89) without importing petastorm, so these
    names must come with pyarrow itself. They are looked up lazily: a process that imports
    pyarrow and never asks for them does not import keras_dl.
    """
    if importlib.machinery.PathFinder.find_spec("pyarrow.filesystem", pyarrow.__path__):
        return  # pyarrow < 16 still has them
    previous = getattr(pyarrow, "__getattr__", None)

    def __getattr__(name):
        if name in _LEGACY_PYARROW_NAMES:
            _layer().prepare()  # sets them as real attributes: this is not called again for them
            return pyarrow.__dict__[name]
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module 'pyarrow' has no attribute {name!r}")

    pyarrow.__getattr__ = __getattr__


def _wrap(spec, after):
    if spec is not None and spec.loader is not None:
        spec.loader = _PatchingLoader(spec.loader, after)
    return spec


class _PatchingLoader(importlib.abc.Loader):
    """Run the real loader, then ``after(module)`` (e.g. the layer swaps the module's ``pq``)."""

    def __init__(self, loader, after) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name):  # get_code, get_source, is_package... (runpy, inspect)
        return getattr(self._loader, name)
