"""SIGTERM/SIGINT to the driver of a multi-worker Spark job: every worker checkpoints and stops.

On this host :class:`~keras_dl.launch.workers.MultiWorkerRunner` sends the signal on to its
worker processes; on Spark they run on other hosts. So the driver writes a ``stop`` marker
to the job's output folder (:mod:`keras_dl.launch.rank_output`: one the executors reach), and
each task, which lists that folder every second, sends SIGTERM to its worker. The workers stop
after the same step, the chief writes that step's checkpoint, and the job ends as a preemption
(:class:`~keras_dl.errors.Preempted`, exit 75): the same command resumes it.

The chief's task writes ``ended-00000`` once its worker has exited; the other tasks whose
workers stopped as a preemption (the driver's marker, or a SIGTERM of their own, e.g. an
executor decommissioned) wait for it (up to ``CHIEF_GRACE`` seconds) before they fail their
task, since a failed barrier task ends the others' (the chief's checkpoint would be cut short).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

from keras_dl import storage
from keras_dl.errors import PREEMPTED_EXIT
from keras_dl.storage import retry

log = logging.getLogger(__name__)

STOP = "stop"
CHIEF_GRACE = 30.0  # seconds a stopped worker's task waits for the chief's to end
POLL_SECONDS = 1.0


def _ended(rank: int) -> str:
    return f"ended-{rank:05d}"


@contextlib.contextmanager
def stop_on_signal(folder: str | None):
    """On the driver, within the block: SIGTERM/SIGINT write ``folder``'s stop marker instead of
    ending this process; a second one does what it did before. Without a folder, or off the
    main thread, nothing changes."""
    if folder is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    asked = threading.Event()
    marker = storage.join(folder, STOP)

    def write() -> None:
        retry.retrying(lambda: storage.write_atomic(marker, b""), marker)

    def handler(signum, frame) -> None:
        if asked.is_set():  # a second signal: what it did before (end this process)
            previous = saved.get(signum)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        asked.set()
        print(
            f"{signal.Signals(signum).name}: asking every worker to checkpoint and stop "
            "(rerun the same command to resume; signal again to stop this process now).",
            flush=True,
        )
        threading.Thread(target=write, daemon=True, name="keras_dl-stop").start()

    saved: dict = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


class StopWatch:
    """In a task: SIGTERM to ``proc`` (its worker) once the driver's stop marker appears."""

    def __init__(self, folder: str, rank: int, proc):
        self.folder, self.rank, self.proc = folder, rank, proc
        self.asked = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="keras_dl-stop")
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            try:
                names = storage.list_files(self.folder)
            except Exception as exc:  # the store hiccuped: list again
                log.debug("could not list %s: %s", self.folder, exc)
                continue
            if STOP in names:
                self.asked = True
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGTERM)
                return

    def ended(self, code: int, store_lost: bool = False) -> None:
        """The worker exited with ``code``: stop watching. The chief's task says it ended (a
        failed chief's in the background: its report must reach the driver first, and the
        store may be what it lost). A task whose worker stopped as a preemption (asked here, or
        its own SIGTERM: exit 75) waits for that (``CHIEF_GRACE`` at most), so the chief's
        checkpoint is written; not when its worker stopped because the store was unreachable
        from its host (``store_lost``): the task cannot list the marker there either."""
        self._done.set()
        if self.rank == 0:
            name = storage.join(self.folder, _ended(0))

            def write() -> None:
                with contextlib.suppress(Exception):
                    retry.retrying(lambda: storage.write_atomic(name, b""), name)

            if code == 0:
                write()
            else:
                threading.Thread(target=write, daemon=True, name="keras_dl-ended").start()
            return
        if code == 0 or store_lost or not (self.asked or code == PREEMPTED_EXIT):
            return
        deadline = time.monotonic() + CHIEF_GRACE
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if _ended(0) in storage.list_files(self.folder):
                    return
            time.sleep(POLL_SECONDS)
