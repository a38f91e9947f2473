"""Readers stop when their iterator is dropped, and before the interpreter exits.

**Dropped.** ``tf.data.Dataset.from_generator`` finalizes its Python generator when the
iterator is destroyed: the generator is closed (``GeneratorExit`` at its ``yield``), and the
``finally`` blocks of the reads it was suspended in stop and join their Petastorm readers.

**Interpreter exit** is what needed this module. A script that leaves an iterator mid-epoch
(``it = iter(ds); next(it)``) hung or aborted at exit, and the cause is not the reader's own
threads: Petastorm's workers and ventilator are daemon threads. It is TensorFlow's prefetch
thread, which calls the generator through a ``py_func`` and so is often inside Python when
the script ends. Once ``Py_FinalizeEx`` has begun, a thread that takes the GIL is ended
(``PyThread_exit_thread``). A TF thread ended mid-call never completes its ``py_func``, and when
finalization then destroys the module's iterator, ``~PrefetchDatasetOp::Iterator`` waits for that
call forever (seen with gdb: the main thread in ``UnboundedThreadPool::LogicalThreadWrapper``'s
destructor). When the thread is ended inside C++ frames, the process aborts instead ("terminate
called without an active exception"). A daemon reader thread ended while Arrow decodes (it
takes the GIL back afterwards) aborts the same way.

So before finalization, while the interpreter is whole, :func:`_stop_at_exit` makes sure no
thread is in a read or about to start one:

1. it marks the process as exiting. Every read then stops at its next row group
   (:func:`check_open` raises :class:`ReadersClosed`), a generator guarded by
   :func:`guard_generator` ends at its next step, and no reader is opened any more;
2. it waits until no guarded generator step and no :func:`run_tracked` thread (the next
   epoch's reader opened ahead) is running;
3. it stops and joins every reader still open (those of generators suspended at a ``yield``).

A generator that TensorFlow calls after that returns at once, and the iterators left behind are
destroyed at finalization with no thread inside Python. The hook runs from
``threading._register_atexit`` (what ``concurrent.futures`` uses): in ``threading._shutdown``,
before non-daemon threads are joined and before ``atexit`` handlers run.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)
EXIT_WAIT_SECONDS = 60.0  # the longest the exit hook waits for reads in progress
_SETTLE_SECONDS = 0.05  # no generator step may start during this long before readers stop

_exiting = threading.Event()
_lock = threading.Lock()
_busy = 0  # guarded generator steps and tracked threads running now
_started = 0  # how many have started, ever: a step that starts while the hook waits is seen
_readers: weakref.WeakSet = weakref.WeakSet()


class ReadersClosed(Exception):
    """Raised inside a read when the interpreter is exiting: the read ends, nothing is lost."""


def check_open() -> None:
    """Raise :class:`ReadersClosed` when the interpreter is exiting (call between row groups
    and before opening a reader).

    Raises:
        ReadersClosed: When the exit hook has started.
    """
    if _exiting.is_set():
        raise ReadersClosed("the interpreter is exiting")


def track(reader):
    """Remember an open Petastorm reader, to stop and join it at exit. Returns ``reader``."""
    _readers.add(reader)
    return reader


def guard_generator(make: Callable[[], Iterator]) -> Callable[[], Iterator]:
    """``make`` (a ``from_generator`` generator function), counted while it runs a step and
    ended at the next step once the interpreter is exiting."""

    @functools.wraps(make)
    def guarded():
        items = make()
        try:
            while True:
                with _running:
                    if _exiting.is_set():
                        return
                    try:
                        item = next(items)
                    except (StopIteration, ReadersClosed):
                        return
                    if _exiting.is_set():
                        return  # TF would only ask for another: end now
                yield item
        finally:
            items.close()  # a dropped iterator: the reads' ``finally`` stops their readers

    return guarded


def run_tracked(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` (a thread's target that reads), counted while it runs, so the exit hook waits
    for it."""

    @functools.wraps(fn)
    def run():
        with _running:
            return fn()

    return run


class _Running:
    """Counts the reads running now (``_busy``) and ever started (``_started``)."""

    def __enter__(self):
        global _busy, _started
        with _lock:
            _busy += 1
            _started += 1

    def __exit__(self, *exc):
        global _busy
        with _lock:
            _busy -= 1
        return False


_running = _Running()


def _stop_at_exit() -> None:
    _exiting.set()
    if _started == 0 and not _readers:
        return  # this process never read through a generator: nothing to wait for
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while time.monotonic() < deadline:
        with _lock:
            busy, started = _busy, _started
        if busy == 0:
            time.sleep(_SETTLE_SECONDS)
            with _lock:
                if _busy == 0 and _started == started:
                    break
        else:
            time.sleep(0.01)
    else:
        log.warning(
            "keras_dl: reads still running %.0f s after the script ended; exiting anyway.",
            EXIT_WAIT_SECONDS,
        )
    for reader in list(_readers):
        try:
            reader.stop()
            reader.join()
        except Exception:  # exiting: a reader that cannot stop must not stop the others
            log.debug("keras_dl: stopping a reader at exit failed", exc_info=True)


def _register() -> None:
    try:
        threading._register_atexit(_stop_at_exit)
    except (AttributeError, RuntimeError):  # not CPython 3.9+, or imported during shutdown
        import atexit

        atexit.register(_stop_at_exit)


_register()
