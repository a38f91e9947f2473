"""Make Petastorm itself read its metadata pickles through keras_dl's restricted unpickler.

Petastorm 0.13.1, ``etl/dataset_metadata.py`` line 383 (in ``get_schema``)::

    schema = depickle_legacy_package_name_compatible(ser_schema)

and ``etl/legacy.py``'s ``restricted_loads``, which that calls, allow every global in the
``builtins``, ``numpy``, ``petastorm`` and ``pyspark`` packages: a ``_common_metadata`` whose
pickle calls ``builtins.exec`` runs it. ``make_reader``, ``make_batch_reader`` (both through
``get_schema_from_dataset_url`` and ``Reader``'s ``infer_or_load_unischema``) and row-group
indexes (``etl/rowgroup_indexing.py`` line 157) all get there.

:func:`install` replaces ``get_schema`` (so errors name the dataset folder, and a Unischema
keras_dl already read is reused, see :func:`~keras_dl.data.tables.petastorm_meta.known_unischema`)
and ``depickle_legacy_package_name_compatible`` wherever a loaded Petastorm module holds them.
Within :func:`~keras_dl.data.tables.petastorm_meta.trusting` Petastorm's own loader is used.
"""

from __future__ import annotations

import sys
import warnings

_installed = False
# Row-group indexes (etl/rowgroup_indexers.py) are data too: the indexers and their sets.
_INDEX_CLASSES = frozenset(
    {
        ("petastorm.etl.rowgroup_indexers", "SingleFieldIndexer"),
        ("petastorm.etl.rowgroup_indexers", "FieldNotNullIndexer"),
        ("collections", "defaultdict"),
    }
)


def install() -> None:
    """Patch Petastorm's metadata unpickling to the restricted loader (idempotent)."""
    global _installed
    if _installed:
        return
    # Import every Petastorm module that holds a reference, so none keeps the original.
    import petastorm.etl.rowgroup_indexing  # noqa: F401
    import petastorm.reader  # noqa: F401
    from petastorm.etl import dataset_metadata, legacy

    _replace(
        legacy.depickle_legacy_package_name_compatible, depickle_legacy_package_name_compatible
    )
    _replace(dataset_metadata.get_schema, get_schema)
    _installed = True


def get_schema(dataset):
    """Petastorm's ``get_schema(dataset)``, with the Unischema read by the restricted loader.

    Raises:
        PetastormMetadataError: As Petastorm does, when there is no Unischema (so
            ``infer_or_load_unischema`` still falls back to the Parquet schema).
        DataError: When the Unischema's pickle names anything but data.
    """
    from petastorm.etl.dataset_metadata import UNISCHEMA_KEY, PetastormMetadataError

    from keras_dl.data.tables import petastorm_meta

    folder = _folder(dataset)
    known = petastorm_meta.lookup_known(folder)
    if known is not None:
        return known
    with warnings.catch_warnings():  # pyarrow deprecates the attribute Petastorm reads too
        warnings.simplefilter("ignore", FutureWarning)
        common = dataset.common_metadata
    metadata = common.metadata if common else None
    if not metadata or UNISCHEMA_KEY not in metadata:
        raise PetastormMetadataError(
            f"No Unischema in the _common_metadata of {folder!r}. Use materialize_dataset(..) "
            "in petastorm.etl.dataset_metadata to write one."
        )
    return petastorm_meta.loads_unischema(metadata[UNISCHEMA_KEY], folder)


def depickle_legacy_package_name_compatible(pickled_string: bytes):
    """Petastorm's loader of metadata pickles, through the restricted unpickler."""
    from keras_dl.data.tables import petastorm_meta

    return petastorm_meta.loads(
        pickled_string,
        "(a Petastorm metadata pickle)",
        trust=petastorm_meta.trusted(),
        extra=_INDEX_CLASSES,
    )


def _replace(original, patched) -> None:
    # `from ... import name` copies the function into each importing module: swap every copy.
    for name, module in list(sys.modules.items()):
        if name == "petastorm" or name.startswith("petastorm."):
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, patched)


def _folder(dataset) -> str:
    paths = getattr(dataset, "paths", None)
    if isinstance(paths, (list, tuple)):
        return paths[0] if len(paths) == 1 else ", ".join(map(str, paths))
    return str(paths)
