"""Keras' scikit-learn and matplotlib extras load on first use (keras_dl_keras_hook).

A fresh interpreter of the environment, with no PYTHONPATH: what it sees comes from the .pth file
installed with keras-dl, as in a Horovod rank or a Spark Python worker that never imports
keras_dl before Keras.
"""

from __future__ import annotations

import json
import os
import subprocess

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
seen["keras_dl_loaded"] = "keras_dl" in sys.modules
print(json.dumps(seen))
"""


def test_keras_imports_without_its_extras_and_they_load_on_first_use(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = tmp_path / "probe.py"  # a file: autograph converts only functions with a source
    probe.write_text(CODE)
    out = subprocess.run(
        [REAL_PYTHON, str(probe)], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "with_keras": [],  # neither scikit-learn nor pyplot came with `import keras`
        "autograph": True,
        "after_autograph": [],  # nor with a tf.data map's autograph conversion
        "classifier_is_an_estimator": True,  # the wrapper, loaded when asked for, is whole
        "tf_keras_same_class": True,
        "gallery_plt": "matplotlib.pyplot",
        "hook_loaded": True,  # from the .pth file,
        "keras_dl_loaded": False,  # which does not import keras_dl
    }
