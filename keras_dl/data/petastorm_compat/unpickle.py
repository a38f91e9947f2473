"""Make Petastorm itself read its metadata pickles through keras_dl's restricted unpickler.

Petastorm 0.13.1, ``etl/dataset_metadata.py`` line 383 (in ``get_schema``)::

    schema = depickle_legacy_package_name_compatible(ser_schema)

and ``etl/legacy.py``'s ``restricted_loads``, which that calls, allow every global in the
``builtins``, ``numpy``, ``petastorm`` and ``pyspark`` packages: a ``_common_metadata`` whose
pickle calls ``builtins.exec`` runs it. ``make_reader``, ``make_batch_reader`` (both through
``get_schema_from_dataset_url`` and ``Reader``'s ``infer_or_load_unischema``) and row-group
indexes (``etl/rowgroup_indexing.py`` line 157) all get there.

:func:`patch_module` replaces ``get_schema`` (so errors name the dataset folder, and a Unischema
keras_dl already read is reused, see :func:`~keras_dl.data.tables.petastorm_meta.known_unischema`)
and ``depickle_legacy_package_name_compatible`` wherever a Petastorm module holds them. The
import hook calls it for every Petastorm module as it loads, so ``make_reader`` called directly
gets the restricted loader too.
Within :func:`~keras_dl.data.tables.petastorm_meta.trusting` Petastorm's own loader is used.
"""

from __future__ import annotations

import sys
import warnings

# Row-group indexes (etl/rowgroup_indexers.py) are data too: the indexers and their sets.
_INDEX_CLASSES = frozenset(
    {
        ("petastorm.etl.rowgroup_indexers", "SingleFieldIndexer"),
        ("petastorm.etl.rowgroup_indexers", "FieldNotNullIndexer"),
        ("collections", "defaultdict"),
    }
)
# id(Petastorm's function) -> (it, keras_dl's replacement), once its module has loaded.
_replaced: dict[int, tuple] = {}


def patch_module(module) -> bool:
    """Swap Petastorm's metadata loaders in ``module`` for the restricted ones (idempotent).

    ``petastorm.etl.legacy`` and ``petastorm.etl.dataset_metadata`` get the replacements; every
    other Petastorm module gets its copies of them swapped (``from ... import name`` copies a
    function into the importing module).
    """
    targets = {
        "petastorm.etl.legacy": (
            "depickle_legacy_package_name_compatible",
            depickle_legacy_package_name_compatible,
        ),
        "petastorm.etl.dataset_metadata": ("get_schema", get_schema),
    }
    if module.__name__ not in targets:
        return _swap(module)
    name, replacement = targets[module.__name__]
    original = getattr(module, name)
    if original is replacement:
        return False
    _replaced[id(original)] = (original, replacement)
    setattr(module, name, replacement)
    for other_name, other in list(sys.modules.items()):
        if other is not None and (other_name == "petastorm" or other_name.startswith("petastorm.")):
            _swap(other)
    return True


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


def _swap(module) -> bool:
    swapped = False
    for attr, value in list(vars(module).items()):
        entry = _replaced.get(id(value))
        if entry is not None and entry[0] is value:
            setattr(module, attr, entry[1])
            swapped = True
    return swapped


def _folder(dataset) -> str:
    paths = getattr(dataset, "paths", None)
    if isinstance(paths, (list, tuple)):
        return paths[0] if len(paths) == 1 else ", ".join(map(str, paths))
    return str(paths)
