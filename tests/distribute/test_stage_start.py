"""A multi-worker barrier stage on the suite's classic local[2] session whose tasks cannot all
start (another job took a slot after the launcher's free-slot check): cancelled after
``start_timeout``, naming how many started, and the session's next barrier stage gets both
slots. The deadlines below only keep a launcher without the timeout from hanging the suite."""

from __future__ import annotations

import cloudpickle

from keras_dl.errors import DistributedError
from keras_dl.launch.spark_workers import run_spark_workers
from keras_dl.launch.stage_start import started_tasks
from tests.distribute.slot_holder import hold_a_slot, launch_with_a_slot_held

# On the classic session only: Connect has its own (tests/distribute/test_rank_output).


def test_workers_whose_tasks_find_no_free_slots_are_cancelled_after_start_timeout(spark, tmp_path):
    sc = spark.sparkContext
    holder = sc.parallelize([0], 1).mapPartitions(hold_a_slot(str(tmp_path)))
    payload = cloudpickle.dumps((lambda: 0, (), {}))  # never unpickled: no task starts

    def launch():
        return run_spark_workers(spark, payload, 2, {}, str(tmp_path / "logs"), start_timeout=5)

    alive, outcome, waited = launch_with_a_slot_held(holder.collect, tmp_path, launch)
    assert not alive, "the barrier stage waited for its slots beyond start_timeout"
    error = outcome.get("error")
    assert isinstance(error, DistributedError), outcome
    text = str(error)
    assert "The multi-worker workers did not all start within runtime.start_timeout=5 s" in text
    assert "(MultiWorkerRunner's start_timeout)" in text and "0 of the 2 Spark tasks" in text
    assert "The Spark job was cancelled" in text and "raise runtime.start_timeout" in text
    print(f"the stage was cancelled {waited:.1f} s after it was submitted")
    # The cancelled stage holds no slot: a barrier stage of both runs now.
    assert sc.parallelize(range(2), 2).barrier().mapPartitions(lambda it: [1]).collect() == [1, 1]


def test_a_group_without_jobs_has_no_started_tasks(spark):
    assert started_tasks(spark.sparkContext, "keras_dl-stage-none") == 0
