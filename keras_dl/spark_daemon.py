"""Spark's Python worker daemon, with TensorFlow, Keras and MLflow imported before it forks.

Spark runs Python tasks in workers that its daemon (``python -m pyspark.daemon``, one per
executor) forks; a worker is reused while busy and ended after a minute idle (Spark's
``PythonWorkerFactory.IDLE_WORKER_TIMEOUT_NS``). Each worker that scores a Keras model, trains a
tuning trial or fits the Spark ML estimator imports TensorFlow, Keras and MLflow itself: about
4-5 CPU-s a worker on 2 cores, every time, and the next scoring job a minute later pays again.

keras_dl's sessions run this module as the daemon instead (``spark.python.daemon.module``, set
by :func:`keras_dl.distribute.loopback.spark_conf`, which names it but never imports it): it
imports those packages once, then runs
pyspark's own daemon, so every forked worker starts with them already in memory
(copy-on-write). Only imports run here, no TensorFlow op: no device, thread pool or session
exists before the fork, and each task still picks its GPUs (``CUDA_VISIBLE_DEVICES``) before
TensorFlow first touches one. On a host with an NVIDIA device (``/dev/nvidiactl``) TensorFlow and
Keras are left to each worker all the same: CUDA cannot serve a process forked after it was
initialized, and keras_dl does not bet on TensorFlow's import leaving it alone. The daemon's
stdout is its channel to Spark (it writes its port there), so whatever the imports print goes
to stderr. A package that fails to import is left to the worker that needs it, which reports the
error as it would without this module.

It is an entry point, as ``keras_dl.cli`` is: a process Spark starts, at the top of the layers,
so it may load MLflow through keras_dl.tracking, MLflow's one home in keras_dl.
"""

from __future__ import annotations

import os
import sys


def preload(loads=None) -> list[str]:
    """Import the packages keras_dl's Python tasks use (``loads``: ``(name, function)`` pairs,
    by default :func:`preloads` of this host); the names of those that failed."""
    failed = []
    saved = os.dup(1)
    os.dup2(2, 1)  # the imports' prints and logs stay off the daemon's channel to Spark
    try:
        for name, load in preloads(os.path.exists("/dev/nvidiactl")) if loads is None else loads:
            try:
                load()
            except Exception:  # noqa: BLE001 - the worker that needs it raises it again
                failed.append(name)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    return failed


def _tensorflow():
    import tensorflow  # noqa: F401


def _keras():
    import keras  # noqa: F401


def _mlflow():
    from keras_dl.tracking.models import preload

    preload()


def _arrow_and_pandas():
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401


def preloads(gpu_host: bool) -> tuple:
    """What the daemon imports: not TensorFlow nor Keras on a host with a GPU (see the module)."""
    frameworks = () if gpu_host else (("tensorflow", _tensorflow), ("keras", _keras))
    return (("pyarrow, pandas", _arrow_and_pandas), *frameworks, ("mlflow", _mlflow))


def main() -> None:
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
