"""Petastorm's thread pool through keras_dl's compatibility layer
(:mod:`keras_dl.data.petastorm_compat.waits`): a waiting worker sleeps until it is given work or
room, or the pool stops, instead of waking every millisecond; a stop still ends every worker;
work and errors reach the reader as before."""

from __future__ import annotations

import threading
import time

import pytest

from keras_dl.data import petastorm_compat

IDLE_S = 0.5  # how long the tests leave a worker waiting
# Wakes a waiting worker may take in IDLE_S: one per WAIT_S (0.1 s), with room to spare.
# Petastorm's own 1 ms polling takes about 500.
MAX_WAKES = 15


def _pool(workers: int = 1):
    petastorm_compat.install()
    from petastorm.workers_pool.thread_pool import ThreadPool
    from petastorm.workers_pool.worker_base import WorkerBase

    class Echo(WorkerBase):
        def process(self, value):
            if value == "boom":
                raise ValueError("boom: the worker failed")
            self.publish_func(value)

    pool = ThreadPool(workers, results_queue_size=5)
    pool.start(Echo)
    return pool


def _counting(q, method: str) -> list:
    """Count the calls of ``q.method`` (the worker holds the same queue object)."""
    calls: list = []
    real = getattr(q, method)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    setattr(q, method, counted)
    return calls


def _stopped(pool) -> None:
    pool.stop()
    done = threading.Thread(target=pool.join, daemon=True)
    done.start()
    done.join(timeout=10)  # a liveness bound: the workers end within one wait, 0.1 s
    assert not done.is_alive() and not any(w.is_alive() for w in pool._workers)


def test_the_patch_is_in_place_once():
    from keras_dl.data.petastorm_compat import waits

    petastorm_compat.install()
    import petastorm.workers_pool.thread_pool as module

    assert module.WorkerThread.run._keras_dl_patched
    assert module.ThreadPool.stop._keras_dl_patched
    assert not waits.patch_module(module)  # idempotent


def test_an_idle_worker_sleeps_until_it_is_given_work():
    pool = _pool()
    try:
        time.sleep(0.1)  # the worker is waiting for its first item
        gets = _counting(pool._ventilator_queues[0], "get")
        time.sleep(IDLE_S)
        assert len(gets) <= MAX_WAKES, f"{len(gets)} wakes in {IDLE_S} s with no work"
        pool.ventilate(value=7)  # work wakes it at once
        assert pool.get_results() == 7
    finally:
        _stopped(pool)


def test_a_worker_waiting_for_room_sleeps_and_a_stop_ends_it():
    pool = _pool()
    results = pool._results_queues[0]
    for i in range(20):  # nobody reads: the worker fills its results queue, then waits for room
        pool.ventilate(value=i)
    deadline = time.monotonic() + 10
    while not results.full() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results.full()
    puts = _counting(results, "put")
    time.sleep(IDLE_S)
    assert len(puts) <= MAX_WAKES, f"{len(puts)} tries to publish in {IDLE_S} s"
    _stopped(pool)


def test_results_come_back_in_order_and_a_workers_error_reaches_the_reader(capfd):
    pool = _pool(workers=2)
    try:
        for i in range(10):
            pool.ventilate(value=i)
        assert [pool.get_results() for _ in range(10)] == list(range(10))
        pool.ventilate(value="boom")
        with pytest.raises(ValueError, match="boom: the worker failed"):
            pool.get_results()
    finally:
        _stopped(pool)
    assert "terminated: unexpected exception" in capfd.readouterr().err  # as Petastorm reports it
