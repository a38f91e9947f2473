"""The import hook that defers Keras' scikit-learn and matplotlib extras until they are used.

``import keras`` (3.15, on TensorFlow) runs ``keras.wrappers``, which imports scikit-learn (and
through it SciPy) to define ``SKLearnClassifier``, and ``keras.src.visualization``, which
imports ``matplotlib.pyplot``. Both are installed in a keras-dl environment because MLflow
requires them, so every process that imports Keras pays for them: 1.6-1.8 CPU-s of the 5.5-6 a
bare ``import keras`` takes here (``/usr/bin/time python -c "import keras"``, three runs each:
5.5-6.0 CPU-s without this hook, 3.9-4.0 with it). keras-dl starts many such processes: every
Horovod rank, every Spark Python worker that scores a model, every ``python -m recipes.NAME``.

:func:`register` puts :class:`KerasExtrasFinder` first on ``sys.meta_path``. It loads the
modules named in :data:`DEFERRED` with :class:`DeferredLoader` (:class:`importlib.util.LazyLoader`
that leaves a module's identity readable): the module object is created when Keras imports it,
and its code runs (importing scikit-learn or matplotlib) on the first other attribute anyone
reads from it. ``keras.wrappers.SKLearnClassifier`` and
``from keras.visualization import plot_image_gallery`` work as before; only their cost moves to
their first use. A module this hook cannot find, or whose loader cannot be made lazy, is loaded
the usual way, so a Keras that renames these modules is not broken, only not sped up.

It is opt-in: :func:`register` does nothing unless the environment variable
``KERAS_DL_DEFER_KERAS_EXTRAS`` (:data:`ENV`) is set to ``1`` (any value but empty or ``0``)
when it runs, so a user's interpreters import Keras exactly as Keras ships it. The test suite
sets it for itself and every process it starts (``tests/conftest.py``), where it saves CPU-s
per subprocess; a user who starts many processes may set it too.

Like ``keras_dl_petastorm_hook`` it is top-level and imports only the standard library, so that
``keras_dl_petastorm_compat.pth`` can register it in every Python process of the environment
(Spark's Python workers and Horovod ranks included, when they inherit the variable) without
importing keras_dl, and ``import keras_dl`` registers it too (a source tree on ``PYTHONPATH``).
It does nothing for a process that imported Keras before registering it.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
import types

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


# The environment variable that turns the hook on (off when unset, empty or "0").
ENV = "KERAS_DL_DEFER_KERAS_EXTRAS"


def enabled() -> bool:
    """Whether :data:`ENV` asks for the hook."""
    return os.environ.get(ENV, "").strip() not in ("", "0")


def register() -> bool:
    """Put the finder first on ``sys.meta_path`` when :func:`enabled` (idempotent).

    Returns whether the finder is installed."""
    if any(isinstance(f, KerasExtrasFinder) for f in sys.meta_path):
        return True
    if not enabled():
        return False
    sys.meta_path.insert(0, KerasExtrasFinder())
    return True


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
        spec.loader = DeferredLoader(spec.loader)
        return spec


class DeferredLoader(importlib.abc.Loader):
    """Create the module now; run its code on the first read of anything but its identity.

    Like :class:`importlib.util.LazyLoader`, except that reading the attributes the import
    system set before the module's code runs (``__name__``, ``__file__``, ``__spec__``...) does
    not run it: TensorFlow's autograph reads every loaded module's ``__file__`` each time it
    converts a function (``inspect_utils._fix_linecache_record``), which would load them all
    on a training run's first ``tf.data`` map.
    """

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = self.loader
        module.__loader__ = self.loader
        state = {"__dict__": dict(module.__dict__), "lock": threading.RLock()}
        module.__spec__.loader_state = state
        module.__class__ = _DeferredModule

    def __getattr__(self, name):  # get_code, get_source, is_package... (runpy, inspect)
        return getattr(self.loader, name)


# What the import system sets on a module before its code runs: read without running it.
_IDENTITY = frozenset(
    {"__name__", "__file__", "__spec__", "__loader__", "__package__", "__cached__", "__class__"}
)


class _DeferredModule(types.ModuleType):
    def __getattribute__(self, attr):
        if attr in _IDENTITY:
            own = object.__getattribute__(self, "__dict__")
            if attr in own:
                return own[attr]
            if attr == "__class__":
                return _DeferredModule
        _load(self)
        return getattr(self, attr)

    def __delattr__(self, attr):
        _load(self)
        delattr(self, attr)


def _load(module) -> None:
    """Run ``module``'s code once (the first thread to get here; the others wait for it).

    What was set on the module meanwhile (the import system binds a submodule on its parent)
    is put back over what its code sets, as :class:`importlib.util.LazyLoader` does."""
    own = object.__getattribute__(module, "__dict__")
    state = own["__spec__"].loader_state
    with state["lock"]:
        if type(module) is not _DeferredModule:
            return
        then = state["__dict__"]
        set_since = {k: v for k, v in own.items() if k not in then or then[k] is not v}
        module.__class__ = types.ModuleType
        own["__spec__"].loader.exec_module(module)
        own.update(set_since)


def _spec_from_other_finders(finder, fullname, path, target):
    for other in sys.meta_path:
        find = getattr(other, "find_spec", None)
        spec = None if other is finder or find is None else find(fullname, path, target)
        if spec is not None:
            return spec
    return None
