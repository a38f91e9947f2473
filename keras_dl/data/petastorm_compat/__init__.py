"""Patches that keep Petastorm 0.13.1 (its last release) reading exactly and safely.

Each submodule fixes one thing and names the Petastorm line it replaces:

- :mod:`.types`: Arrow types Petastorm's schema inference dropped (uint16/32/64, fixed-size and
  large lists, large strings and binaries), and a catch-all so an unknown type never drops a column.
- :mod:`.race`: the thread pool's end-of-read race, which ended finite reads with row groups
  still in flight.
- :mod:`.unpickle`: metadata pickles (the Unischema) read by an unpickler that builds only data.

:func:`install` applies them all, once per process. It is called before any Petastorm reader is
made (``keras_dl.data.reader``), so every pool type and every process that reads gets them.
"""

from __future__ import annotations

import warnings

_installed = False


def install() -> None:
    """Apply every patch (idempotent, thread-safe enough: patches are plain attribute sets)."""
    global _installed
    if _installed:
        return
    from keras_dl.data.petastorm_compat import race, types, unpickle

    types.install()
    race.install()
    # Petastorm's workers warn about pyarrow's legacy dataset on every read, from their own
    # threads (where a caller's catch_warnings does not reach): keep them off stderr.
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    unpickle.install()
    _installed = True
