"""More Spark tasks than the cluster can ever run at once are refused at once, naming it."""

from __future__ import annotations

import pytest

from keras_dl.distribute.slots import wait_for_free_slots
from keras_dl.errors import DistributedError


@pytest.mark.connect_too
def test_more_tasks_than_the_clusters_slots_in_all_are_refused_at_once(spark):
    # settle and timeout far beyond the test's run: a refusal here did not wait for them.
    with pytest.raises(DistributedError) as caught:
        wait_for_free_slots(3, timeout=3600, settle=3600)
    text = str(caught.value)
    assert text.startswith("runtime.np=3 needs 3 free Spark task slots, but the ")
    assert "has 2 free of 2 at most" in text and "Use runtime.np <= 2" in text
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        assert "the cluster at local[2]" in text and "spark.master=local[2]" in text


@pytest.mark.connect_too
def test_tasks_the_cluster_has_free_slots_for_pass(spark):
    wait_for_free_slots(2, timeout=3600, settle=3600)


def test_a_process_out_of_connect_mode_gets_its_classic_session(
    spark, _spark_sessions, monkeypatch
):
    # A Connect session that still exists (a Connect test ran first on this process) is not
    # the user's once pyspark is out of Connect mode: the classic session is.
    from keras_dl.distribute.slots import active_session

    remote = _spark_sessions.connect()
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    assert active_session() is not remote
    assert not type(active_session()).__module__.startswith("pyspark.sql.connect")
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    assert active_session() is remote


def test_an_executor_registering_while_the_wait_checks_the_master_is_counted(spark, monkeypatch):
    # CI, at a load of 15: the slow executor registered while the wait read the master's JSON
    # (granted 2, registered 2: none launching), and the wait refused with the count it had read
    # before ("needs 2 free Spark task slots ... 1 free of 1").
    from keras_dl.distribute import slots

    world = {"registered": 1}

    def free_task_slots(sc):
        return world["registered"], world["registered"]

    def executors_launching(sc):
        world["registered"] = 2  # the slow JVM registers while the master is asked
        return False

    monkeypatch.setattr(slots, "free_task_slots", free_task_slots)
    monkeypatch.setattr(slots, "executors_launching", executors_launching)
    slots.wait_for_free_slots(2, timeout=60, settle=0.2)
