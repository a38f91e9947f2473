"""keras_dl: Keras 3 training on lakehouse tables.

Delta/Parquet/Spark/TFDS -> Petastorm reader -> tf.data -> ``model.fit`` (one device,
MirroredStrategy or Horovod) -> MLflow. Import what you need from the submodules::

    from keras_dl.config import resolve
    from keras_dl.data import open_table, make_splits
    from keras_dl.callbacks import MLflowLogger
    from keras_dl.train import fit
"""

import keras_dl_keras_hook
import keras_dl_petastorm_hook

__version__ = "0.1.0"

# Petastorm 0.13.1 needs keras_dl's compatibility layer (keras_dl.data.petastorm_compat) on
# pyarrow >= 15 / numpy 2, loaded before it is imported. The .pth file installed with the package
# registers the hook at interpreter start; this covers a keras_dl used from a source tree
# (PYTHONPATH) without it. Cheap: nothing is imported until Petastorm is.
keras_dl_petastorm_hook.register()
# Keras' scikit-learn and matplotlib extras load on first use, not with Keras, only when
# KERAS_DL_DEFER_KERAS_EXTRAS=1 is set (opt-in, keras_dl_keras_hook; the test suite sets it).
keras_dl_keras_hook.register()


def tune(exp, space):
    """Search ``space`` over ``exp``'s recipe with Optuna: see :func:`keras_dl.tuning.study.tune`.

    ``space`` is a list of ``"section.key=KIND(ARGS)"`` strings or parsed dimensions.
    """
    from keras_dl.tuning.space import parse_space
    from keras_dl.tuning.study import tune as tune_study

    return tune_study(exp, [parse_space([d])[0] if isinstance(d, str) else d for d in space])
