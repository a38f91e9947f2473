"""The Spark Connect barrier tasks' output, on the driver while the stage runs.

A Connect client gets a stage's rows only when the stage ends, and it cannot count the stage's
running tasks. So each barrier task (:mod:`keras_dl.launch.barrier`) writes to a folder that
the driver and the executors both reach (a local folder, or ``s3://`` / ``abfss://`` through
:mod:`keras_dl.storage`): an empty ``rank-R.started`` when the task starts, then its rank's
output lines, prefixed ``[R]<stdout>:``, as numbered files ``rank-R.SEQ.out`` (a new one each
second that has new lines: object stores have no append). The driver collects the stage in a
thread and meanwhile prints every new file (:func:`collect_watched`); when the ranks have not
all started within ``start_timeout``, it cancels the Spark job (its tag) and raises.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid

from keras_dl import storage
from keras_dl.launch.stage_start import collect_within, not_started
from keras_dl.storage import retry

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # how often a task writes its new lines


def _started(rank: int) -> str:
    return f"rank-{rank:05d}.started"


def _chunk(rank: int, seq: int) -> str:
    return f"rank-{rank:05d}.{seq:09d}.out"


class RankOutputWriter:
    """On an executor: a rank's start marker and its output lines, written to ``folder``."""

    def __init__(self, folder: str, rank: int):
        self.folder = folder
        self.rank = rank
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._seq = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="keras_dl-output")

    def start(self) -> None:
        """Say that this rank's task has started; write new lines every ``FLUSH_SECONDS``."""
        marker = storage.join(self.folder, _started(self.rank))
        retry.retrying(lambda: storage.write_atomic(marker, b""), marker)
        self._thread.start()

    def add(self, text: str) -> None:
        with self._lock:
            self._pending.append(text)

    def close(self, timeout: float | None = None) -> None:
        """Write the last lines (before the task returns its row, so the driver has them all),
        waiting ``timeout`` seconds at most: a failed task's error carries its last lines to
        the driver anyway, and must not wait on a store its host cannot reach."""
        if self._done.is_set():
            return
        self._done.set()
        last = threading.Thread(target=self._last, daemon=True, name="keras_dl-output-last")
        last.start()
        last.join(timeout)

    def _last(self) -> None:
        if self._thread.is_alive():
            self._thread.join()
        self._flush()

    def _loop(self) -> None:
        while not self._done.wait(FLUSH_SECONDS):
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            text, self._pending = "".join(self._pending), []
        if not text:
            return
        try:
            storage.write_atomic(
                storage.join(self.folder, _chunk(self.rank, self._seq)), text.encode()
            )
            self._seq += 1
        except Exception as exc:  # only the live copy: the task's row holds the whole output
            with self._lock:
                self._pending.insert(0, text)  # the next flush tries again
            log.debug("rank %d: could not write its output to %s: %s", self.rank, self.folder, exc)


class RankOutputTail:
    """On the driver: print each new file the ranks wrote to ``folder``, in rank order."""

    def __init__(self, folder: str, out=None):
        self.folder = folder
        self.out = out or sys.stdout
        self.started: set[int] = set()
        self.text: list[str] = []  # what was printed, for the failure's explanation
        self._seen: set[str] = set()

    def poll(self) -> None:
        try:
            names = sorted(storage.list_files(self.folder))
        except Exception as exc:  # the store hiccuped: the next poll lists again
            log.debug("could not list the ranks' output in %s: %s", self.folder, exc)
            return
        for name in names:
            if name in self._seen:
                continue
            if name.endswith(".started"):
                self.started.add(int(name.split(".")[0].split("-")[1]))
            elif name.endswith(".out"):
                try:
                    text = storage.read_file(storage.join(self.folder, name)).decode(
                        errors="replace"
                    )
                except Exception as exc:
                    log.debug("could not read %s: %s", name, exc)
                    return  # keep the order: this file and the later ones next time
                self.out.write(text)
                self.text.append(text)
            self._seen.add(name)
        self.out.flush()

    def remove(self) -> None:
        """Delete what the ranks wrote (the driver keeps its own copy of the output)."""
        for name in self._seen:
            try:
                storage.remove(storage.join(self.folder, name))
            except Exception as exc:
                log.debug("could not remove %s: %s", name, exc)
        local = storage.local_path(self.folder)
        if local is not None and os.path.isdir(local) and not os.listdir(local):
            os.rmdir(local)


def output_folder(spark, output_dir: str | None, logs: str) -> str | None:
    """Where this job's tasks write their output: a new folder under ``output_dir``; without
    one, under ``logs`` when the executors run on this host (a Connect server on loopback with
    a local master or one on loopback), else None (the output is printed when the stage ends,
    and ``start_timeout`` cannot apply)."""
    if output_dir is not None:
        return storage.join(str(output_dir), uuid.uuid4().hex)
    if _executors_here(spark):
        return os.path.join(logs, "ranks")
    log.warning(
        "The Spark Connect server is not on this host: the Horovod ranks' output is printed when "
        "the barrier stage ends, and start_timeout does not apply. Pass HorovodRunner a "
        "folder the executors reach (output_dir=, e.g. s3://bucket/logs) to see it live."
    )
    return None


def _executors_here(spark) -> bool:
    """Whether ``spark``'s executors run on this host: its Connect server on loopback, with a
    ``local`` master or a master on loopback."""
    loopback = ("localhost", "127.0.0.1", "[::1]", "::1")
    try:
        host = spark.client.host
        master = spark.conf.get("spark.master", "") or ""
    except Exception:  # a client without these: assume elsewhere
        return False
    master_host = master.split("://", 1)[-1].split(":", 1)[0].split(",", 1)[0]
    return host in loopback and (master.startswith("local") or master_host in loopback)


def collect_watched(spark, df, np: int, tail: RankOutputTail, start_timeout: float) -> list:
    """``df.collect()`` on a Spark Connect session, printing ``tail`` while it runs; the ranks
    started are the start markers ``tail`` has seen (:func:`~keras_dl.launch.stage_start.collect_within`).

    Raises:
        DistributedError: When fewer than ``np`` ranks started within ``start_timeout``
            seconds (the Spark job is cancelled first).
    """
    tag = f"keras_dl-barrier-{uuid.uuid4().hex}"

    def collect() -> list:
        spark.addTag(tag)  # the tags of a Connect client are its thread's
        try:
            return df.collect()
        finally:
            spark.removeTag(tag)

    return collect_within(
        collect,
        lambda: len(tail.started),
        lambda: spark.interruptTag(tag),
        np,
        start_timeout,
        lambda count: not_started(np, count, start_timeout, "Horovod ranks", "HorovodRunner"),
        tick=tail.poll,
    )
