"""What runs on each Horovod rank, whichever launcher started it (``horovod.spark.run``, Gloo
processes on this host, or a Spark Connect barrier task): the pickled function, with a failure
reported in the form the driver explains (:mod:`keras_dl.distribute.failures`)."""

from __future__ import annotations

import os

from keras_dl.distribute.failures import report_failure
from keras_dl.distribute.gpus import use_task_gpus
from keras_dl.distribute.network_errors import report_rank_start
from keras_dl.errors import PREEMPTED_EXIT, Preempted

# Horovod 0.28.1's ``horovod.runner.run`` (the local launcher, np < 0) sets two settings it was
# not given to the string "(None,)" in every rank's environment (``horovod/runner/__init__.py``:
# ``self.cycle_time_ms = None,`` and ``self.cache_capacity = None,``, trailing commas), over the
# values the driver had. Horovod parses that as 0: a 0 ms cycle, so a waiting rank spins (measured
# idle for 10 s: 9.9 CPU-s on one rank and 2.8-5.5 on each of two, whatever the driver set,
# against 0.1 and 0.85 with HOROVOD_CYCLE_TIME=5), and a response cache of 0 entries. The driver
# keeps its own values under KEPT + name (keras_dl.launch.runner).
_UNSET = "(None,)"
KEPT = "KERAS_DL_KEPT_"
HOROVOD_SETTINGS = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")


def restore_horovod_settings(environ=os.environ) -> None:
    """Undo Horovod's "(None,)" settings: the driver's value, else Horovod's default (unset)."""
    for key in HOROVOD_SETTINGS:
        if environ.get(key) == _UNSET:
            kept = environ.get(KEPT + key)
            if kept:
                environ[key] = kept
            else:
                del environ[key]


def rank_main(payload: bytes):
    """Entry point on each rank: unpickle ``(main, kwargs)`` and run it; report failures."""
    import cloudpickle

    restore_horovod_settings()  # before main's hvd.init() reads them
    # Its host, pid and Gloo interface, for the driver to explain a death that leaves no report
    # (a Gloo abort in native code, a SIGKILL: keras_dl.distribute.failures).
    report_rank_start()
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
