"""The import hook that lets Petastorm 0.13.1 import and read on a current pyarrow and numpy.

On pyarrow >= 16 ``import petastorm`` itself fails (``pyarrow.filesystem`` is gone), so the
compatibility layer (:mod:`keras_dl.data.petastorm_compat`) must be in place *before* Petastorm
is imported, in every process that imports it: the driver, Petastorm's process-pool workers
(fresh interpreters), Spark's Python workers and Horovod ranks. :func:`register` puts a finder
first on ``sys.meta_path``; it runs at interpreter start from ``keras_dl_petastorm_compat.pth``
(installed into site-packages with the package) and on ``import keras_dl``.

This module must stay cheap and import nothing heavy: the .pth file loads it in every Python
process of the environment (pip included). The finder does nothing until a ``petastorm`` module
is imported; then it loads the layer, which adds only what the installed pyarrow/numpy lack.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys


def register() -> None:
    """Put the Petastorm finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, PetastormFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PetastormFinder())


class PetastormFinder(importlib.abc.MetaPathFinder):
    """Prepare pyarrow/numpy before ``petastorm`` loads; patch each ``petastorm.*`` module after."""

    def __init__(self) -> None:
        self._busy = False  # the layer's own imports must not come back here

    def find_spec(self, fullname, path, target=None):
        if self._busy:
            return None
        if fullname == "pyarrow":
            # A Spark or pool worker may run Petastorm code pickled by value (the lambda
            # ``pyarrow.localfs`` in petastorm/fs_utils.py:89) without importing petastorm:
            # the legacy pyarrow names must come with pyarrow itself.
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, _after_pyarrow)
            return spec
        if not (fullname == "petastorm" or fullname.startswith("petastorm.")):
            return None
        self._busy = True
        try:
            compat = importlib.import_module("keras_dl.data.petastorm_compat")
            compat.prepare()  # numpy aliases and pyarrow.filesystem, before Petastorm's code runs
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not compat.patches_modules():
            return spec
        spec.loader = _PatchingLoader(spec.loader, compat.patch_module)
        return spec


def _after_pyarrow(module) -> None:
    """Add the legacy names once pyarrow has loaded, only where pyarrow lacks them (>= 16)."""
    import importlib.util

    if importlib.util.find_spec("pyarrow.filesystem") is None:
        importlib.import_module("keras_dl.data.petastorm_compat").prepare()


class _PatchingLoader(importlib.abc.Loader):
    """Run the real loader, then let the layer swap the module's references (e.g. its ``pq``)."""

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
