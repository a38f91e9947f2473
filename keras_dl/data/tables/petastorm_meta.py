"""A Petastorm dataset's Unischema, read without running code stored in the table.

Petastorm keeps a dataset's Unischema as a pickle in the ``_common_metadata`` file
(key ``dataset-toolkit.unischema.v1``). Unpickling calls whatever the pickle names, so a folder
anyone could write to could run code in the reader's process. Petastorm 0.13.1's own
``RestrictedUnpickler`` allows whole packages, ``builtins`` included, so ``builtins.exec`` and
``builtins.eval`` pass it.

Here the pickle goes through an unpickler that can build only data: the classes Petastorm
defines in ``petastorm.unischema`` and ``petastorm.codecs``, numpy dtypes, scalars and arrays,
the Spark SQL types codecs hold, ``decimal.Decimal``, ``collections.OrderedDict`` and the few
builtins pickle itself uses. Anything else raises a :class:`~keras_dl.errors.DataError` that
names the dataset and the refused global. A user who trusts the table's writer can opt in
(``data.trust_petastorm_metadata=true``, or :func:`trusting`) to Petastorm's own loader.

Example:
    >>> from keras_dl.data.tables.petastorm_meta import read_unischema
    >>> schema = read_unischema("/data/legacy_petastorm")  # doctest: +SKIP
"""

from __future__ import annotations

import _compat_pickle
import contextlib
import contextvars
import functools
import io
import logging
import os
import pickle
from collections.abc import Iterator
from typing import Any

from keras_dl.errors import DataError
from keras_dl.extras import EXTRAS, MissingExtra, missing_extra_message

log = logging.getLogger(__name__)

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"

# Per thread (and asyncio task): whether the user trusts the metadata being read, and the
# Unischemas keras_dl already read, by folder, so Petastorm's reader does not unpickle again.
_trust: contextvars.ContextVar[bool] = contextvars.ContextVar("trust_petastorm", default=False)
_known: contextvars.ContextVar[tuple] = contextvars.ContextVar("known_unischemas", default=())

# Petastorm's old package names, rewritten as petastorm.etl.legacy does.
_LEGACY_PACKAGES = ("av.experimental.deepdrive.dataset_toolkit", "av.ml.dataset_toolkit")
_LEGACY_MODULES = ("codecs", "unischema", "sequence")
# Petastorm 0.4-0.7 wrote each UnischemaField as pyspark's pickled namedtuple,
# _restore(name, fields, values); pyspark 4 removed _restore, so it is rebuilt here (data only).
_PYSPARK_RESTORE = ("pyspark.serializers", "_restore")
# Modules whose own classes (not what they import) are Petastorm's data.
_PETASTORM_CLASS_MODULES = ("petastorm.unischema", "petastorm.codecs")
_SAFE_GLOBALS = frozenset(
    {
        ("collections", "OrderedDict"),
        ("decimal", "Decimal"),
        # What pickle itself emits: object reconstruction (protocols 0-2) and bytes (0-2).
        ("copyreg", "_reconstructor"),
        ("copyreg", "__newobj__"),
        ("copyreg", "__newobj_ex__"),
        ("_codecs", "encode"),
        # numpy arrays and scalars (numpy 1 and numpy 2 module names).
        *(
            (f"numpy.{core}.{module}", name)
            for core in ("core", "_core")
            for module, name in (
                ("multiarray", "_reconstruct"),
                ("multiarray", "scalar"),
                ("numeric", "_frombuffer"),
            )
        ),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
    }
    | {
        ("builtins", name)
        for name in (
            *("object", "bool", "int", "float", "complex", "str", "bytes", "bytearray"),
            *("tuple", "list", "dict", "set", "frozenset", "slice"),
        )
    }
)


def read_unischema(folder: str, *, trust: bool | None = None) -> Any:
    """The Unischema stored in a local Petastorm dataset's ``_common_metadata``.

    Args:
        folder: The dataset's folder (a local path or ``file://`` URL).
        trust: Load with Petastorm's own unpickler, which can run code the pickle names. Only
            for tables whose writer you trust. Defaults to None: the :func:`trusting` scope,
            which is off unless entered.

    Returns:
        A ``petastorm.unischema.Unischema``.

    Raises:
        DataError: When the folder has no Unischema, or its pickle names anything but data.
    """
    import pyarrow.parquet as pq

    folder = os.path.abspath(folder.removeprefix("file://"))
    meta = os.path.join(folder, "_common_metadata")
    try:
        data = (pq.read_metadata(meta).metadata or {})[UNISCHEMA_KEY]
    except (OSError, KeyError) as exc:
        raise DataError(
            f"Petastorm dataset {folder!r} has no Unischema in {meta!r} ({exc!r}). Write it with "
            "petastorm.etl.dataset_metadata.materialize_dataset, or read the folder as Parquet."
        ) from None
    return loads_unischema(data, folder, trust=trust)


def loads_unischema(data: bytes, source: str, *, trust: bool | None = None) -> Any:
    """Unpickle a Unischema from ``data`` (the metadata value), refusing anything but data.

    Args:
        data: The pickled Unischema, as stored under ``dataset-toolkit.unischema.v1``.
        source: The dataset folder, named in errors.
        trust: As in :func:`read_unischema`. Defaults to None (the :func:`trusting` scope).

    Raises:
        DataError: When the pickle names a global outside the allowed data classes, is not a
            Unischema, or cannot be read.
    """
    from petastorm.unischema import Unischema

    if trust is None:
        trust = _trust.get()
    obj = loads(data, source, trust=trust)
    if not isinstance(obj, Unischema):
        raise DataError(
            f"Petastorm dataset {source!r}: its _common_metadata holds a pickled "
            f"{type(obj).__name__}, not a Unischema. Re-materialize the dataset with "
            "petastorm.etl.dataset_metadata.materialize_dataset."
        )
    _check_image_codecs(obj, source)
    return obj


def _check_image_codecs(schema, source: str) -> None:
    """Raise naming the [images] extra when a field's codec is Petastorm's image codec and
    OpenCV is missing: Petastorm's decode would fail in a reader thread, ``cv2`` undefined."""
    import petastorm.codecs

    if petastorm.codecs.OPENCV_AVAILABLE:
        return
    for field in schema.fields.values():
        if isinstance(field.codec, petastorm.codecs.CompressedImageCodec):
            raise MissingExtra(
                missing_extra_message(
                    "cv2",
                    f"Petastorm dataset {source!r} (field {field.name!r} is stored with CompressedImageCodec)",
                )
            )


def loads(data: bytes, source: str, *, trust: bool = False, extra: frozenset = frozenset()):
    """Unpickle Petastorm metadata through the restricted unpickler (or Petastorm's, trusted).

    Args:
        data: A pickle from a Petastorm dataset's metadata.
        source: The dataset folder or metadata key, named in errors.
        trust: Use Petastorm's own ``restricted_loads`` (as Petastorm does). Defaults to False.
        extra: More ``(module, name)`` globals to allow, e.g. row-group indexers.
            Defaults to none.

    Raises:
        DataError: When the pickle names a refused global or cannot be read.
        MissingExtra: When it holds classes of a package not installed (Spark SQL types
            without PySpark).
    """
    try:
        if trust:
            return _trusted_loads(_rename_legacy_bytes(data), source)
        return _DataUnpickler(io.BytesIO(data), source, extra).load()
    except DataError:
        raise
    except ImportError as exc:
        # Petastorm's ScalarCodec pickles the Spark SQL type of its column: such a dataset
        # needs PySpark to be read, which a core install does not have.
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        raise MissingExtra(
            missing_extra_message(
                top, f"Petastorm dataset {source!r} (its schema holds {exc.name} classes)", exc
            )
        ) from None
    except Exception as exc:
        raise DataError(
            f"Petastorm dataset {source!r}: its metadata pickle cannot be read ({exc!r}). "
            "Re-materialize the dataset, or read the folder as plain Parquet."
        ) from None


@contextlib.contextmanager
def trusting(trust: bool = True) -> Iterator[None]:
    """Within this block (this thread), load Petastorm metadata with Petastorm's own unpickler.

    Only for tables whose writer you trust: a pickle can run any code when loaded.

    Args:
        trust: Whether to trust; False restores the restricted loader inside an outer
            ``trusting()``. Defaults to True.
    """
    token = _trust.set(bool(trust))
    try:
        yield
    finally:
        _trust.reset(token)


def trusted() -> bool:
    """Whether this thread is inside a :func:`trusting` block."""
    return _trust.get()


@contextlib.contextmanager
def known_unischema(folder: str, unischema: Any) -> Iterator[None]:
    """Within this block (this thread), Petastorm gets ``unischema`` for ``folder`` unread.

    keras_dl reads a dataset's Unischema once, when it opens the table; its reader then enters
    this block so Petastorm's ``make_reader`` does not unpickle the metadata a second time
    (which would also read a file that may have changed since).
    """
    token = _known.set(((_normalize(folder), unischema), *_known.get()))
    try:
        yield
    finally:
        _known.reset(token)


def lookup_known(folder: str) -> Any:
    """The Unischema given to :func:`known_unischema` for ``folder`` in this scope, or None."""
    folder = _normalize(folder)
    return next((schema for path, schema in _known.get() if path == folder), None)


class _DataUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` returns only data classes (see the module docstring)."""

    def __init__(self, file, source: str, extra: frozenset):
        super().__init__(file)
        self._source, self._extra = source, extra

    def find_class(self, module: str, name: str):
        module, name = _rename(module, name)
        if (module, name) == _PYSPARK_RESTORE:
            return functools.partial(_restore_unischema_field, self._source)
        if (module, name) in _SAFE_GLOBALS or (module, name) in self._extra:
            return super().find_class(module, name)
        obj = _data_class(module, name)
        if obj is None:
            raise DataError(
                f"Petastorm dataset {self._source!r}: its metadata pickle refers to "
                f"{module}.{name}, which is not a Petastorm, numpy or Spark data class, so "
                "keras_dl did not load it (unpickling it could run code written into the table). "
                "Set data.trust_petastorm_metadata=true only if you trust who wrote the table."
            )
        return obj


def _trusted_loads(data: bytes, source: str):
    """Petastorm's own ``restricted_loads``, plus the fields of Petastorm 0.4-0.7 datasets."""
    from petastorm.etl.legacy import RestrictedUnpickler

    class Unpickler(RestrictedUnpickler):
        def find_class(self, module, name):
            if (module, name) == _PYSPARK_RESTORE:
                return functools.partial(_restore_unischema_field, source)
            return super().find_class(module, name)

    return Unpickler(io.BytesIO(data)).load()


def _restore_unischema_field(source: str, name: str, fields, values):
    """A ``UnischemaField`` from the namedtuple pickle of Petastorm 0.4-0.7 (pyspark's ``_restore``)."""
    from petastorm.unischema import UnischemaField

    fields = tuple(fields)
    if name != "UnischemaField" or not {"name", "numpy_dtype", "shape"} <= set(fields) <= set(
        UnischemaField._fields
    ):
        raise DataError(
            f"Petastorm dataset {source!r}: its metadata pickle (from Petastorm 0.4-0.7) holds a "
            f"pyspark namedtuple {name}{fields}, not a UnischemaField. Regenerate the metadata with "
            f"`petastorm-generate-metadata --dataset_url {source}` (Petastorm's own tool)."
        )
    return UnischemaField(**dict(zip(fields, values)))


def _data_class(module: str, name: str):
    """The class ``module.name`` if it is one of the allowed data classes, else None."""
    if module in _PETASTORM_CLASS_MODULES:
        import petastorm.codecs
        import petastorm.unischema

        found = {"petastorm.unischema": petastorm.unischema, "petastorm.codecs": petastorm.codecs}
        obj = vars(found[module]).get(name)
        return obj if isinstance(obj, type) and obj.__module__ == module else None
    if module == "numpy" or module == "numpy.dtypes":
        import numpy as np
        import numpy.dtypes

        obj = vars(np if module == "numpy" else numpy.dtypes).get(name)
        ok = isinstance(obj, type) and issubclass(obj, (np.generic, np.dtype))
        return obj if ok else None
    if module == "pyspark.sql.types":
        from pyspark.sql import types

        obj = vars(types).get(name)
        ok = isinstance(obj, type) and obj.__module__ == module
        return obj if ok and issubclass(obj, (types.DataType, types.StructField)) else None
    return None


def _rename(module: str, name: str) -> tuple[str, str]:
    """Python 2 names (``__builtin__``, ``copy_reg``) and Petastorm's old package names."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    for package in _LEGACY_PACKAGES:
        for legacy in _LEGACY_MODULES:
            if module == f"{package}.{legacy}":
                log.warning(
                    'Depickling "%s" which has moved to "petastorm.%s". Regenerate metadata.',
                    module,
                    legacy,
                )
                return f"petastorm.{legacy}", name
    return module, name


def _rename_legacy_bytes(data: bytes) -> bytes:
    # Petastorm's own rewrite (etl/legacy.py), for its loader when trusted.
    for package in _LEGACY_PACKAGES:
        for legacy in _LEGACY_MODULES:
            old = f"\n(c{package}.{legacy}\n".encode("ascii")
            data = data.replace(old, f"\n(cpetastorm.{legacy}\n".encode("ascii"))
    return data


def _normalize(folder: str) -> str:
    return os.path.normpath(os.path.abspath(str(folder).removeprefix("file://")))
