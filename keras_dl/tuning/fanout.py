"""Trials as Spark tasks: ``tune.parallelism`` tasks at a time on the Horovod launcher's Spark.

Each task opens the study's journal and runs its share of the trials one after another
(:func:`~keras_dl.tuning.trial.run_trials`), so at most ``parallelism`` train at a time. The
session is the active one, else one started as :func:`keras_dl.launch.job.start_spark` starts
it for ``runtime.np > 0`` (``MASTER`` or ``spark-defaults.conf``; a local master otherwise),
and stopped after. The tasks run through ``mapInPandas``, which classic and Spark Connect
sessions both have. The journal must be a path every task can reach: this host's disk for a
local or loopback standalone cluster, a shared mount otherwise. With GPU-aware scheduling each
task's trials train on the GPUs Spark gave that task, as ranks and scoring tasks do
(:func:`~keras_dl.distribute.gpus.use_task_gpus`); each trial's run is tagged with them.
A task Spark retries (a lost executor, a crashed Python worker) runs only the trials its
failed attempt did not end, and that attempt's running trial runs again.
"""

from __future__ import annotations

import uuid

from keras_dl.distribute.slots import active_session
from keras_dl.launch.job import start_spark
from keras_dl.tuning.trial import TrialSpec


def run_on_spark(spec: TrialSpec, quotas: list[int]) -> dict[int, list[int]]:
    """Run ``quotas[i]`` trials in Spark task ``i``; return each task's trial numbers."""
    started = start_spark(spec.exp.runtime)
    session = active_session() or started
    fanout = uuid.uuid4().hex[:12]  # names this call's tasks: a retried task finds its trials
    try:
        frame = session.range(len(quotas), numPartitions=len(quotas))
        rows = frame.mapInPandas(
            lambda batches: _task(spec, quotas, fanout, batches), "worker long, trials string"
        ).collect()
    finally:
        if started is not None:
            started.stop()
    return {r.worker: [int(n) for n in r.trials.split(",") if n] for r in rows}


def _task(spec: TrialSpec, quotas: list[int], fanout: str, batches):
    """In the Spark task: run this partition's workers' trials. Each attempt Spark makes of
    the task names them ``<fanout>/<worker>``, so a retry runs only what the failed attempt
    left (:func:`~keras_dl.tuning.trial.run_trials`)."""
    import os
    import warnings

    import pandas as pd

    from keras_dl.distribute.gpus import use_task_gpus

    use_task_gpus()  # this task's GPUs only, before TensorFlow starts in this worker
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    from keras_dl.tuning.trial import run_trials

    for batch in batches:
        for worker in batch["id"]:
            task = f"{fanout}/{int(worker)}"
            numbers = run_trials(spec, quotas[int(worker)], worker=int(worker), task=task)
            yield pd.DataFrame({"worker": [int(worker)], "trials": [",".join(map(str, numbers))]})
