"""Keras' scikit-learn and matplotlib extras load on first use (keras_dl_keras_hook), opt-in.

A fresh interpreter of the environment, with only this checkout's root on PYTHONPATH (so the .pth
file installed with keras-dl loads this checkout's hook, and nothing imports keras_dl): what it
sees comes from the .pth file, as in a Horovod rank or a Spark Python worker that never imports
keras_dl before Keras. Off by default (a user's interpreter imports Keras as it ships), on with
``KERAS_DL_DEFER_KERAS_EXTRAS=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras_dl_keras_hook
from tests.conftest import REPO
from tests.warm_python import REAL_PYTHON

CODE = """
import json, sys
import keras
EXTRAS = ("sklearn", "matplotlib.pyplot")
seen = {"with_keras": sorted(m for m in EXTRAS if m in sys.modules)}
import tensorflow as tf
# Autograph reads every loaded module's __file__ when it converts a function: still deferred.
def double(x):
    return x * 2 if x > 0 else x  # a Python `if` on a tensor: autograph must convert it
ds = tf.data.Dataset.range(3).map(double)
seen["autograph"] = [int(v) for v in ds] == [0, 2, 4]
seen["after_autograph"] = sorted(m for m in EXTRAS if m in sys.modules)
from keras.wrappers import SKLearnClassifier
import sklearn.base
seen["classifier_is_an_estimator"] = issubclass(SKLearnClassifier, sklearn.base.BaseEstimator)
seen["tf_keras_same_class"] = tf.keras.wrappers.SKLearnClassifier is SKLearnClassifier
from keras.visualization import plot_image_gallery
import keras.src.visualization.plot_image_gallery as gallery
seen["gallery_plt"] = gallery.plt.__name__
seen["hook_loaded"] = "keras_dl_keras_hook" in sys.modules
seen["hook_installed"] = any(
    type(f).__name__ == "KerasExtrasFinder" for f in sys.meta_path
)
seen["keras_dl_loaded"] = "keras_dl" in sys.modules
print(json.dumps(seen))
"""


def _probe(tmp_path, **extra_env) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", keras_dl_keras_hook.ENV)}
    env.update(PYTHONPATH=str(REPO), **extra_env)
    probe = tmp_path / "probe.py"  # a file: autograph converts only functions with a source
    probe.write_text(CODE)
    out = subprocess.run(
        [REAL_PYTHON, str(probe)], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_keras_imports_without_its_extras_and_they_load_on_first_use(tmp_path):
    seen = _probe(tmp_path, KERAS_DL_DEFER_KERAS_EXTRAS="1")
    assert seen == {
        "with_keras": [],  # neither scikit-learn nor pyplot came with `import keras`
        "autograph": True,
        "after_autograph": [],  # nor with a tf.data map's autograph conversion
        "classifier_is_an_estimator": True,  # the wrapper, loaded when asked for, is whole
        "tf_keras_same_class": True,
        "gallery_plt": "matplotlib.pyplot",
        "hook_loaded": True,  # from the .pth file,
        "hook_installed": True,
        "keras_dl_loaded": False,  # which does not import keras_dl
    }


def test_without_the_variable_keras_imports_as_it_ships(tmp_path):
    seen = _probe(tmp_path)  # the variable dropped from the suite's environment
    assert seen == {
        "with_keras": ["matplotlib.pyplot", "sklearn"],  # Keras' own imports, not deferred
        "autograph": True,
        "after_autograph": ["matplotlib.pyplot", "sklearn"],
        "classifier_is_an_estimator": True,
        "tf_keras_same_class": True,
        "gallery_plt": "matplotlib.pyplot",
        "hook_loaded": True,  # the .pth file imports the module,
        "hook_installed": False,  # which installs nothing
        "keras_dl_loaded": False,
    }


def test_register_in_process_follows_the_variable(monkeypatch):
    """register() installs the finder only when asked, and once."""
    before = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", [f for f in before if not _is_finder(f)])
    monkeypatch.delenv(keras_dl_keras_hook.ENV, raising=False)
    assert keras_dl_keras_hook.register() is False
    assert not any(_is_finder(f) for f in sys.meta_path)
    for off in ("", "0"):
        monkeypatch.setenv(keras_dl_keras_hook.ENV, off)
        assert keras_dl_keras_hook.register() is False
    monkeypatch.setenv(keras_dl_keras_hook.ENV, "1")
    assert keras_dl_keras_hook.register() is True
    assert keras_dl_keras_hook.register() is True
    assert sum(_is_finder(f) for f in sys.meta_path) == 1
    assert _is_finder(sys.meta_path[0])


def _is_finder(f) -> bool:
    return isinstance(f, keras_dl_keras_hook.KerasExtrasFinder)
