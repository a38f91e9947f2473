"""What runs on each Horovod rank, whichever launcher started it (``horovod.spark.run``, Gloo
processes on this host, or a Spark Connect barrier task): the pickled function, with a failure
reported in the form the driver explains (:mod:`keras_dl.distribute.failures`)."""

from __future__ import annotations

import os

from keras_dl.distribute.failures import report_failure
from keras_dl.distribute.gpus import use_task_gpus
from keras_dl.errors import PREEMPTED_EXIT, Preempted


def rank_main(payload: bytes):
    """Entry point on each rank: unpickle ``(main, kwargs)`` and run it; report failures."""
    import cloudpickle

    use_task_gpus()  # a rank of a Spark task sees only that task's GPUs (before TF starts)
    main, kwargs = cloudpickle.loads(payload)
    try:
        return main(**kwargs)
    except BaseException as exc:
        report_failure(exc)
        # Exit now: the other ranks may be blocked in a collective with this one, and Horovod's
        # background thread could keep this interpreter alive. The launcher sees the non-zero
        # exit and terminates the rest of the job.
        os._exit(PREEMPTED_EXIT if isinstance(exc, Preempted) else 1)
