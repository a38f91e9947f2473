"""Put back the numpy names that Petastorm 0.13.1 uses and numpy 2 removed.

Each one is a synonym of something numpy still has, so adding it back changes the meaning of no
existing name; only code probing ``hasattr(np, "unicode_")`` to tell numpy 1 from 2 could notice
(none in keras_dl's environment does). They are set on the numpy module itself because
``petastorm/tf_utils.py:37`` reads ``np.string_`` while the module is being imported. On numpy
1.26 every name exists and nothing is touched.
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
}


def missing() -> list[str]:
    """The aliases this numpy lacks."""
    return [name for name in ALIASES if name not in np.__dict__]


def install() -> list[str]:
    """Add the missing aliases to numpy; returns their names (empty on numpy 1.26)."""
    added = missing()
    for name in added:
        # Set in the module dict: numpy 2's module __getattr__ would raise for these names.
        setattr(np, name, ALIASES[name][0])
    return added
