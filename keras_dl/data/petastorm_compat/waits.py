"""Let the thread pool's idle workers sleep until there is work, instead of waking every 1 ms.

Petastorm 0.13.1, ``workers_pool/thread_pool.py``: ``IO_TIMEOUT_INTERVAL_S = 0.001`` (line 26)
is how long a worker waits for its next item (``WorkerThread.run``, line 60) and for room in its
results queue (``ThreadPool._stop_aware_put``, line 250) before it looks at the stop event
again. A worker that waits is therefore woken a thousand times a second, and each wake takes
the interpreter lock from the thread that feeds tf.data. Workers wait most of the time whenever
the consumer is the slower side (every epoch of a table that decodes faster than it trains):
two idle workers held 6 % of a core here with nothing to do, and the wide table's packed
pipeline ran 7 % faster, and the narrow table at batch 32 10 % faster, with 5-9 % less CPU per
row, once they slept (interleaved rounds of ``keras-dl bench input``'s pipeline).

The patch waits up to :data:`WAIT_S` instead, and makes ``ThreadPool.stop`` wake every worker
at once: it hands each worker's item queue a wake-up token (which is not work) and empties the
results queues (a reader that stops takes no more results). A stop therefore ends the workers
no later than before, so stopping a reader between epochs costs nothing more. Items are
processed and their results published exactly as before, in the same order.
"""

from __future__ import annotations

import queue
import sys
from traceback import format_exc

WAIT_S = 0.1  # the longest a waiting worker sleeps before it looks at the stop event again
_WAKE = ("keras_dl: wake up",)  # put in an item queue by stop(): not work, never processed


def patch_module(module) -> bool:
    """Replace the thread pool's 1 ms polling (idempotent).

    Applies to ``petastorm.workers_pool.thread_pool`` only; returns whether it patched it now.
    """
    if module.__name__ != "petastorm.workers_pool.thread_pool":
        return False
    pool, thread = module.ThreadPool, module.WorkerThread
    if getattr(thread.run, "_keras_dl_patched", False):
        return False
    from petastorm.workers_pool import VentilatedItemProcessedMessage

    terminate = module.WorkerTerminationRequested
    stop_pool = pool.stop

    def run(self) -> None:
        if self._profiling_enabled:
            self.prof.enable()
        while not self._stop_event.is_set():
            try:
                item = self._ventilator_queue.get(block=True, timeout=WAIT_S)
            except queue.Empty:
                continue
            if item is _WAKE:
                continue  # stop() woke this worker: the loop sees the stop event
            args, kwargs = item
            try:
                self._worker_impl.process(*args, **kwargs)
                self._worker_impl.publish_func(VentilatedItemProcessedMessage())
            except terminate:
                pass
            except Exception as e:  # as Petastorm's: reported, handed to the reader, the end
                message = (
                    f"Worker {self._worker_impl.worker_id} terminated: unexpected exception:\n"
                )
                sys.stderr.write(message + format_exc())
                self._results_queue.put(e)
                break
        if self._profiling_enabled:
            self.prof.disable()

    def _stop_aware_put(self, worker_id, data) -> None:
        results = self._results_queues[worker_id]
        while True:
            try:
                results.put(data, block=True, timeout=WAIT_S)
                return
            except queue.Full:
                pass
            if self._stop_event.is_set():
                raise terminate()

    def stop(self) -> None:
        stop_pool(self)  # the ventilator stopped, then the stop event set
        for items in getattr(self, "_ventilator_queues", ()):
            items.put(_WAKE)
        for results in getattr(self, "_results_queues", ()):
            try:
                while True:
                    results.get_nowait()  # room again: a worker waiting to publish returns
            except queue.Empty:
                pass

    originals = ((run, thread.run), (_stop_aware_put, pool._stop_aware_put), (stop, pool.stop))
    for patched, original in originals:
        patched.__doc__ = original.__doc__
        patched._keras_dl_patched = True
    thread.run = run
    pool._stop_aware_put = _stop_aware_put
    pool.stop = stop
    return True
