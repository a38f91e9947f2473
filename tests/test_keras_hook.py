"""Keras' scikit-learn and matplotlib extras load on first use (keras_dl_keras_hook).

A fresh interpreter of the environment, with no PYTHONPATH: what it sees comes from the .pth file
installed with keras-dl, as in a Horovod rank or a Spark Python worker that never imports
keras_dl before Keras.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CODE = """
import json, sys
import keras
seen = {"with_keras": sorted(m for m in ("sklearn", "matplotlib.pyplot") if m in sys.modules)}
import tensorflow as tf
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


def test_keras_imports_without_its_extras_and_they_load_on_first_use():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "with_keras": [],  # neither scikit-learn nor pyplot came with `import keras`
        "classifier_is_an_estimator": True,  # the wrapper, loaded when asked for, is whole
        "tf_keras_same_class": True,
        "gallery_plt": "matplotlib.pyplot",
        "hook_loaded": True,  # from the .pth file,
        "keras_dl_loaded": False,  # which does not import keras_dl
    }
