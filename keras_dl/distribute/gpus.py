"""The GPUs Spark gave the current task, made the only ones TensorFlow sees.

With GPU-aware scheduling (``spark.executor.resource.gpu.amount`` and
``spark.task.resource.gpu.amount``), Spark hands each task the addresses of its GPUs, and two
tasks on one executor get different ones. A process that ignores them and picks a GPU by its
local rank can land on the GPU another task was given (spark-tensorflow-distributor PR #160 and
Horovod PR #3737 fixed exactly this). Here every place keras_dl runs in a Spark task calls
:func:`use_task_gpus` before TensorFlow initializes its devices:

* each Horovod rank launched on Spark (:mod:`keras_dl.launch.runner`), which is a child process
  of its Spark task: the task's addresses reach it through Horovod's task service
  (``horovod.spark.task.get_available_devices``);
* each scoring task (:func:`keras_dl.inference.executor.load_scorer`).

A launcher that starts a process from its task hands it the task's GPUs with :func:`child_env`.

When Spark assigned no GPU (the default; also the driver and the local ``np < 0`` ranks), the
environment is left alone. Only modules already imported are consulted, so calling it costs
nothing outside Spark.
"""

from __future__ import annotations

import logging
import os
import sys

VISIBLE = "CUDA_VISIBLE_DEVICES"
# Set next to VISIBLE when the addresses came from Spark: Horovod's pinning then takes the first
# visible GPU instead of the local rank (keras_dl.distribute.horovod).
FROM_SPARK = "KERAS_DL_SPARK_GPUS"

_log = logging.getLogger(__name__)
_first: list[str] = []  # the addresses this process applied first (TF keeps its first devices)


def task_gpu_addresses() -> list[str]:
    """The GPU addresses Spark assigned to the task this process runs for; [] when none.

    Read from the Spark task's context (``TaskContext``, ``BarrierTaskContext`` in a barrier
    stage) in a Python worker, else from Horovod's record of the launching task in a rank
    started by ``horovod.spark.run``.
    """
    context = _task_context()
    if context is not None:
        gpu = (context.resources() or {}).get("gpu")
        return list(gpu.addresses) if gpu is not None else []
    # A rank of horovod.spark.run: its task_exec asked the launching task's service for the
    # task's resources before calling our function (horovod >= 0.28, PR #3737).
    task_info = sys.modules.get("horovod.spark.task.task_info")
    if task_info is not None:
        return [str(a) for a in task_info.get_available_devices()]
    return []


def task_gpu_env(addresses: list[str] | None = None) -> dict[str, str]:
    """``{"CUDA_VISIBLE_DEVICES": "0,1"}`` for the task's GPUs, ``{}`` when Spark assigned none.

    Args:
        addresses: GPU addresses (from :func:`task_gpu_addresses` in the task, to hand to a child
            process). Defaults to this task's.
    """
    if addresses is None:
        addresses = task_gpu_addresses()
    return {VISIBLE: ",".join(addresses)} if addresses else {}


def child_env() -> dict[str, str]:
    """The environment that gives a child process of this Spark task the task's GPUs.

    For a launcher that starts a rank as a child of its task, where no ``TaskContext`` exists:
    :func:`task_gpu_env` plus the mark that Horovod's pinning reads (:func:`assigned_by_spark`).
    ``{}`` when Spark assigned no GPU.
    """
    env = task_gpu_env()
    return {**env, FROM_SPARK: env[VISIBLE]} if env else {}


def use_task_gpus() -> dict[str, str]:
    """Make the task's GPUs this process's only visible ones; return what was set.

    Call it before TensorFlow initializes its devices in the process: TF reads
    ``CUDA_VISIBLE_DEVICES`` once. Leaves the environment alone when Spark assigned no GPU.
    """
    env = task_gpu_env()
    if not env:
        return {}
    addresses = env[VISIBLE].split(",")
    if _first and _first != addresses and "tensorflow" in sys.modules:
        # A Python worker Spark reuses for a task with other GPUs: TensorFlow read the variable
        # for the first task, and keeps those GPUs whatever the environment says now.
        _log.warning(
            "This Spark task was given GPU(s) %s, but TensorFlow in this reused Python worker "
            "may already run on GPU(s) %s. Set spark.python.worker.reuse=false to give each "
            "task a fresh worker on its own GPUs.",
            ",".join(addresses),
            ",".join(_first),
        )
    if not _first:
        _first.extend(addresses)
    os.environ.update(env)
    os.environ[FROM_SPARK] = env[VISIBLE]
    return env


def assigned_by_spark() -> bool:
    """Whether this process's visible GPUs are the ones Spark gave its task (:func:`use_task_gpus`)."""
    return bool(os.environ.get(FROM_SPARK)) and os.environ.get(FROM_SPARK) == os.environ.get(
        VISIBLE
    )


def _task_context():
    """The running Spark task's context in this process, or None (driver, plain process)."""
    module = sys.modules.get("pyspark.taskcontext")
    if module is None:  # not a Spark Python worker: do not import pyspark for nothing
        return None
    context = module.TaskContext.get()
    if context is None:
        try:  # a barrier stage keeps its context on the subclass
            context = module.BarrierTaskContext.get()
        except Exception:  # not in a barrier stage
            return None
    return context
