"""Patches that keep Petastorm 0.13.1 (its last release) reading exactly and safely, on the
pyarrow/numpy it was built for (12 / 1.26) and on current ones (pyarrow >= 15, numpy 2).

Each submodule fixes one thing and names the Petastorm lines it replaces:

- :mod:`.types`: Arrow types Petastorm's schema inference dropped (uint16/32/64, fixed-size and
  large lists, large strings and binaries), and a catch-all so an unknown type never drops a column.
- :mod:`.race`: the thread pool's end-of-read race, which ended finite reads with row groups
  still in flight.
- :mod:`.unpickle`: metadata pickles (the Unischema) read by an unpickler that builds only data.
- :mod:`.numpy_aliases`: ``np.unicode_``, ``np.string_``, ``np.in1d`` (removed by numpy 2).
- :mod:`.filesystem`: ``pyarrow.filesystem``, ``localfs``, ``LocalFileSystem`` and ``hdfs``
  (removed by pyarrow 16; without them ``import petastorm`` fails).
- :mod:`.parquet_dataset`: the legacy ``pq.ParquetDataset``/``ParquetDatasetPiece`` (removed by
  pyarrow 15), given to Petastorm's modules as their ``pq``.

The last three add only what the installed pyarrow/numpy lack, so on the old pins they do
nothing. They must be in place before Petastorm is imported: :mod:`keras_dl.petastorm_hook` calls
:func:`prepare` and :func:`patch_module` from an import hook that every process of the
environment registers at start-up (``keras_dl_petastorm_compat.pth``) and ``import keras_dl``
registers too. :func:`install` applies the reader patches (types, race) once per process; it is
called before any Petastorm reader is made (``keras_dl.data.reader``).
"""

from __future__ import annotations

import sys
import warnings

_installed = False
_prepared = False


def prepare() -> None:
    """Add the numpy and pyarrow names Petastorm imports, where missing (idempotent, cheap)."""
    global _prepared
    if _prepared:
        return
    from keras_dl.data.petastorm_compat import filesystem, numpy_aliases

    numpy_aliases.install()
    filesystem.install()
    _prepared = True


def patches_modules() -> bool:
    """True when Petastorm's modules need patching: their ``pq`` (pyarrow >= 15) or their float
    predicates (numpy >= 2)."""
    from keras_dl.data.petastorm_compat import numpy_aliases, parquet_dataset

    return parquet_dataset.needed() or numpy_aliases.needed_for_predicates()


def patch_module(module) -> None:
    """Swap one freshly imported Petastorm module's references to what pyarrow or numpy changed."""
    from keras_dl.data.petastorm_compat import numpy_aliases, parquet_dataset

    parquet_dataset.patch_module(module)
    numpy_aliases.patch_module(module)


def install() -> None:
    """Apply every patch (idempotent, thread-safe enough: patches are plain attribute sets)."""
    global _installed
    if _installed:
        return
    from keras_dl import petastorm_hook

    petastorm_hook.register()  # a no-op when keras_dl's import or the .pth already did it
    prepare()
    # Petastorm modules imported before the hook was registered (possible only where pyarrow
    # still let `import petastorm` succeed) get their references swapped here.
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "petastorm" or name.startswith("petastorm.")):
            patch_module(module)

    from keras_dl.data.petastorm_compat import race, types, unpickle

    types.install()
    race.install()
    # Petastorm's workers warn about pyarrow's legacy dataset on every read, from their own
    # threads (where a caller's catch_warnings does not reach): keep them off stderr.
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    unpickle.install()
    _installed = True
