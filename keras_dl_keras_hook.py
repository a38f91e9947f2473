"""The import hook that defers Keras' scikit-learn and matplotlib extras until they are used.

``import keras`` (3.15, on TensorFlow) runs ``keras.wrappers``, which imports scikit-learn (and
through it SciPy) to define ``SKLearnClassifier``, and ``keras.src.visualization``, which
imports ``matplotlib.pyplot``. Both are installed in a keras-dl environment because MLflow
requires them, so every process that imports Keras pays for them: 1.6-1.8 CPU-s of the 5.5-6 a
bare ``import keras`` takes here (``/usr/bin/time python -c "import keras"``, three runs each:
5.2-6.0 CPU-s without this hook, 3.9-4.0 with it). keras-dl starts many such processes: every
Horovod rank, every Spark Python worker that scores a model, every ``python -m recipes.NAME``.

:func:`register` puts :class:`KerasExtrasFinder` first on ``sys.meta_path``. It loads the
modules named in :data:`DEFERRED` with :class:`importlib.util.LazyLoader`: the module object is
created when Keras imports it, and its code runs (importing scikit-learn or matplotlib) on the
first attribute anyone reads from it. ``keras.wrappers.SKLearnClassifier`` and
``from keras.visualization import plot_image_gallery`` work as before; only their cost moves to
their first use. A module this hook cannot find, or whose loader cannot be made lazy, is loaded
the usual way, so a Keras that renames these modules is not broken, only not sped up.

Like ``keras_dl_petastorm_hook`` it is top-level and imports only the standard library, so that
``keras_dl_petastorm_compat.pth`` can register it in every Python process of the environment
(Spark's Python workers and Horovod ranks included) without importing keras_dl, and
``import keras_dl`` registers it too (a source tree on ``PYTHONPATH``). It does nothing for a
process that imported Keras before registering it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading

# Keras modules whose code only defines optional extras, each imported by Keras' own __init__.
DEFERRED = frozenset(
    {
        "keras.wrappers",  # SKLearnClassifier... : scikit-learn, SciPy
        "keras._tf_keras.keras.wrappers",
        "keras.visualization",  # plot_image_gallery... : matplotlib.pyplot
        "keras._tf_keras.keras.visualization",
        "keras.src.visualization",
    }
)


def register() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, KerasExtrasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, KerasExtrasFinder())


class KerasExtrasFinder(importlib.abc.MetaPathFinder):
    """Give the modules of :data:`DEFERRED` the spec the other finders give, loaded lazily."""

    def __init__(self) -> None:
        self._busy = threading.local()  # this thread's own lookup must not come back here

    def find_spec(self, fullname, path, target=None):
        if fullname not in DEFERRED or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = _spec_from_other_finders(self, fullname, path, target)
        finally:
            self._busy.on = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None  # the usual import, whatever it finds
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def _spec_from_other_finders(finder, fullname, path, target):
    for other in sys.meta_path:
        find = getattr(other, "find_spec", None)
        spec = None if other is finder or find is None else find(fullname, path, target)
        if spec is not None:
            return spec
    return None
