"""keras_dl: Keras 3 training on lakehouse tables.

Delta/Parquet/Spark/TFDS -> Petastorm reader -> tf.data -> ``model.fit`` (one device,
MirroredStrategy or Horovod) -> MLflow. Import what you need from the submodules::

    from keras_dl.config import resolve
    from keras_dl.data import open_table, make_splits
    from keras_dl.callbacks import MLflowLogger
    from keras_dl.train import fit
"""

import keras_dl_petastorm_hook

__version__ = "0.1.0"

# Petastorm 0.13.1 needs keras_dl's compatibility layer (keras_dl.data.petastorm_compat) on
# pyarrow >= 15 / numpy 2, loaded before it is imported. The .pth file installed with the package
# registers the hook at interpreter start; this covers a keras_dl used from a source tree
# (PYTHONPATH) without it. Cheap: nothing is imported until Petastorm is.
keras_dl_petastorm_hook.register()
