"""keras_dl: Keras 3 training on lakehouse tables.

Delta/Parquet/Spark/TFDS -> Petastorm reader -> tf.data -> ``model.fit`` (one device,
MirroredStrategy or Horovod) -> MLflow. Import what you need from the submodules::

    from keras_dl.config import resolve
    from keras_dl.data import open_table, make_splits
    from keras_dl.callbacks import MLflowLogger
    from keras_dl.train import fit
"""

__version__ = "0.1.0"
