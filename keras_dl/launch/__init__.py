"""Launching training on Horovod ranks, the way Databricks' HorovodRunner does:
:class:`HorovodRunner` runs a function on N ranks (local processes or Spark tasks), and
:func:`launch` runs an experiment's ``fit`` on them, owning the run from the driver.

The names load on first use: a Spark task unpickles :mod:`keras_dl.launch.barrier`'s task
function, which imports this package, and the task only starts its rank's process. Importing
``launch`` eagerly would load TensorFlow (through the run's callbacks) into every such task, about
5 CPU-seconds and 700 MB each, before the rank loads it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keras_dl.launch.job import launch, train_rank
    from keras_dl.launch.runner import HorovodRunner
    from keras_dl.launch.workers import MultiWorkerRunner

__all__ = ["HorovodRunner", "MultiWorkerRunner", "launch", "train_rank"]


def __getattr__(name: str):
    if name == "HorovodRunner":
        from keras_dl.launch.runner import HorovodRunner

        return HorovodRunner
    if name == "MultiWorkerRunner":
        from keras_dl.launch.workers import MultiWorkerRunner

        return MultiWorkerRunner
    if name in ("launch", "train_rank"):
        from keras_dl.launch import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
