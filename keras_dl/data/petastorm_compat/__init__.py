"""Patches that keep Petastorm 0.13.1 (its last release) reading exactly and safely, on the
pyarrow/numpy it was built for (12 / 1.26) and on current ones (pyarrow >= 15, numpy 2).

Each submodule fixes one thing and names the Petastorm lines it replaces:

- :mod:`.types`: Arrow types Petastorm's schema inference dropped (uint16/32/64, fixed-size and
  large lists, large strings and binaries), and a catch-all so an unknown type never drops a column.
- :mod:`.race`: the thread pool's end-of-read race, which ended finite reads with row groups
  still in flight.
- :mod:`.waits`: the thread pool's idle workers sleep until there is work (or a stop), instead of
  waking every millisecond and taking the interpreter lock from the thread that feeds tf.data.
- :mod:`.unpickle`: metadata pickles (the Unischema) read by the unpickler that builds only data
  (:mod:`keras_dl.data.tables.petastorm_meta`), which also reads the datasets Petastorm 0.4-0.7
  wrote (their fields were pickled through ``pyspark.serializers._restore``, gone in pyspark 4).
- :mod:`.numpy_aliases`: ``np.unicode_``, ``np.string_``, ``np.in1d`` (removed by numpy 2) and
  ``np.float`` (removed by numpy 1.24).
- :mod:`.filesystem`: ``pyarrow.filesystem``, ``localfs``, ``LocalFileSystem`` and ``hdfs``
  (removed by pyarrow 16; without them ``import petastorm`` fails).
- :mod:`.connect`: ``materialize_dataset`` and ``make_spark_converter`` refuse a Spark Connect
  session by name (they need a SparkContext) instead of failing inside pyspark.
- :mod:`.parquet_dataset`: the legacy ``pq.ParquetDataset``/``ParquetDatasetPiece`` (removed by
  pyarrow 15), given to Petastorm's modules as their ``pq``.

The last three add only what the installed pyarrow/numpy lack, so on the old pins they do
nothing (``np.float`` excepted: numpy 1.26 lacks it too, so Petastorm's ``WeightedSamplingReader``
failed there as well).

The layer must be in place before Petastorm is imported, in every process that uses it. The
top-level module ``keras_dl_petastorm_hook`` does that: it is registered at interpreter start by
``keras_dl_petastorm_compat.pth`` (installed into site-packages with the package) and by
``import keras_dl``, and when a ``petastorm`` module is imported it calls :func:`prepare` first
and :func:`patch_module` on the module once loaded. So every patch applies wherever Petastorm
is used (a user's own ``make_reader``/``make_batch_reader`` included), not only under
keras_dl's reader. The arrows go one way: the hook imports this package; this package never
imports the hook. :func:`install` is for callers about to make a reader (``keras_dl.data.stream.shard_epochs``).
"""

from __future__ import annotations

import sys
import warnings

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


def patch_module(module) -> None:
    """Patch one freshly imported Petastorm module (idempotent): each patch picks its module.

    Its ``pq`` (pyarrow >= 15), its float predicates (numpy >= 2), the thread pool's "done"
    checks and its waits, the row groups a planned reader lists, the Arrow types schema
    inference knows, and its metadata unpickling.
    """
    from keras_dl.data.petastorm_compat import (
        connect,
        numpy_aliases,
        parquet_dataset,
        race,
        row_groups,
        types,
        unpickle,
        waits,
    )

    parquet_dataset.patch_module(module)
    numpy_aliases.patch_module(module)
    race.patch_module(module)
    waits.patch_module(module)
    row_groups.patch_module(module)
    types.patch_module(module)
    unpickle.patch_module(module)
    connect.patch_module(module)


def install() -> None:
    """Make sure every patch is in place in this process (idempotent).

    The import hook (registered by ``import keras_dl``) patches Petastorm's modules as they
    load; this also patches those imported before it was registered (possible only where
    pyarrow < 16 let ``import petastorm`` succeed without it), and keeps Petastorm's workers'
    FutureWarnings about pyarrow's legacy dataset off stderr (they warn from their own threads,
    where a caller's ``catch_warnings`` does not reach).
    """
    global _modules_seen
    prepare()
    import petastorm.etl.rowgroup_indexing  # noqa: F401  (the modules keras_dl's reader uses)
    import petastorm.reader  # noqa: F401
    import petastorm.workers_pool.thread_pool  # noqa: F401

    # Every reader calls this: walk sys.modules only when modules were imported since (a
    # walk costs milliseconds, a reader per source and epoch of a mix).
    if len(sys.modules) != _modules_seen:
        for name, module in list(sys.modules.items()):
            if module is not None and (name == "petastorm" or name.startswith("petastorm.")):
                patch_module(module)
        _modules_seen = len(sys.modules)
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")


_modules_seen = 0  # len(sys.modules) at install()'s last walk
