"""Spark ML for Keras: ``KerasEstimator`` (an Estimator) and ``KerasModel`` (its Transformer).

Params are named as in ``horovod.spark.keras.KerasEstimator``, training goes through
:func:`keras_dl.train.fit` and scoring through the executors' path of ``keras-dl predict``.
Modules: ``params`` (the Params), ``columns`` (features and checks), ``training`` (the Recipe
and the launch), ``estimator``, ``model`` and ``persistence``.
"""

from keras_dl.extras import import_extra

import_extra("pyspark", "keras_dl.spark (KerasEstimator, KerasModel)")  # before its modules do

from keras_dl.spark.estimator import KerasEstimator  # noqa: E402
from keras_dl.spark.model import KerasModel  # noqa: E402

__all__ = ["KerasEstimator", "KerasModel"]
