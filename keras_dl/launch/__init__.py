"""Launching training on Horovod ranks, the way Databricks' HorovodRunner does:
:class:`HorovodRunner` runs a function on N ranks (local processes or Spark tasks), and
:func:`launch` runs an experiment's ``fit`` on them, owning the run from the driver."""

from keras_dl.launch.job import launch, train_rank
from keras_dl.launch.runner import HorovodRunner

__all__ = ["HorovodRunner", "launch", "train_rank"]
