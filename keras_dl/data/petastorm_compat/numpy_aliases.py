"""Put back the numpy names that Petastorm 0.13.1 uses and numpy removed.

Every ``np.<name>`` in the installed Petastorm (its tests included) that the installed numpy
lacks is here; ``tests/data/petastorm_compat/test_hook.py`` checks that by scanning its source. Each
one is a synonym of something Python or numpy still has, so adding it back changes the meaning of
no existing name; only code probing ``hasattr(np, "unicode_")`` to tell numpy 1 from 2 could
notice (none in keras_dl's environment does). They are set on the numpy module itself because
``petastorm/tf_utils.py:37`` reads ``np.string_`` while the module is being imported. On numpy
1.26 only ``np.float`` is missing (removed in 1.24).
"""

from __future__ import annotations

import numpy as np


def _in1d(ar1, ar2, assume_unique=False, invert=False, *, kind=None):
    """``np.in1d`` as numpy 1.x defined it: ``isin`` on the flattened first argument."""
    return np.isin(np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert, kind=kind)


# name -> (replacement, the Petastorm lines that use it, the numpy release that removed it)
ALIASES = {
    "unicode_": (
        np.str_,
        "unischema.py:150,481, arrow_reader_worker.py:67, tf_utils.py:38,87,132",
        "numpy 2.0",
    ),
    "string_": (np.bytes_, "unischema.py:148,491,493, tf_utils.py:37", "numpy 2.0"),
    "in1d": (_in1d, "predicates.py:71 (in_set, in_intersection)", "numpy 2.4 (deprecated in 2.0)"),
    "float": (float, "weighted_sampling_reader.py:62 (WeightedSamplingReader)", "numpy 1.24"),
}


def missing() -> list[str]:
    """The aliases this numpy lacks."""
    return [name for name in ALIASES if name not in np.__dict__]


def install() -> list[str]:
    """Add the missing aliases to numpy; returns their names."""
    added = missing()
    for name in added:
        # Set in the module dict: numpy 2's module __getattr__ would raise for these names.
        setattr(np, name, ALIASES[name][0])
    return added


def legacy_in1d(ar1, ar2, invert: bool = False) -> np.ndarray:
    """``np.in1d(ar1, ar2)`` with the answers numpy 1.26 gave, on numpy 1 and 2 alike.

    numpy 1.26 compared ``ar1`` with each value of a short ``ar2`` (fewer than
    ``10 * len(ar1) ** 0.145`` values) as a *scalar*, and its value-based casting turned a float
    scalar into ``ar1``'s float type first: ``float32(0.1)`` matched ``0.1``. numpy 2 (NEP 50)
    compares in float64, so the same predicate stops matching. A long ``ar2`` went through a
    sorted concatenation, promoted in both releases; integer comparisons are exact in both.
    """
    ar1 = np.asarray(ar1).ravel()
    ar2 = np.asarray(ar2).ravel()
    if (
        ar1.dtype.kind == "f"
        and ar2.dtype.kind == "f"
        and ar2.dtype.itemsize > ar1.dtype.itemsize
        and len(ar2) < 10 * len(ar1) ** 0.145
    ):
        with np.errstate(over="ignore"):
            cast = ar2.astype(ar1.dtype)
        # numpy 1 kept a scalar that overflows ar1's type at full precision: it matches nothing.
        ar2 = cast[np.isfinite(cast) | ~np.isfinite(ar2)]
    return np.isin(ar1, ar2, invert=invert)


def patch_module(module) -> bool:
    """Give ``petastorm.predicates.in_intersection`` numpy 1.26's float matching (numpy >= 2).

    Replaces ``petastorm/predicates.py:71`` ``any(np.in1d(values[field], inclusion_values))``:
    under numpy 2's NEP 50 promotion a float32 field no longer matched the Python float it was
    written from.
    """
    if module.__name__ != "petastorm.predicates" or not needed_for_predicates():
        return False

    def do_include(self, values):
        import collections.abc

        if not isinstance(values[self._predicate_field], collections.abc.Iterable):
            raise ValueError("Predicate field should have iterable type")
        return any(legacy_in1d(values[self._predicate_field], self._inclusion_values))

    module.in_intersection.do_include = do_include
    return True


def needed_for_predicates() -> bool:
    """True on numpy 2 and later, whose NEP 50 promotion changed ``in1d`` on floats."""
    return int(np.__version__.split(".")[0]) >= 2
