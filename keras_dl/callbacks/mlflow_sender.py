"""The sending thread behind :class:`~keras_dl.callbacks.mlflow_logger.MLflowLogger`.

Params and metrics are queued by the training thread and sent by this one, so logging never
waits on the tracking store. While the store is unreachable the values stay buffered, a warning
is given once, and sending is retried every ``retry_interval`` seconds; when the store answers
again the buffer goes out in order, with the original timestamps and steps. A value the store
rejects (e.g. a param logged before with another value) is dropped and counted, since retrying
cannot help and holding it would block everything behind it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable

from keras_dl.tracking.client import metric, param
from keras_dl.tracking.rest import is_reachable, is_rejection, send_batch

log = logging.getLogger(__name__)

_MAX_BATCH = 900  # MLflow's log_batch takes at most 1000 values per call


class MLflowSender:
    """Send queued params and metrics to one MLflow run from a background thread.

    Args:
        client: An ``MlflowClient`` for ``uri``.
        uri: The tracking URI (an HTTP server gets a ``/health`` check before each attempt).
        run_id: The run to log to; None to create it (with ``create_run``) once the store
            answers, so an unreachable server delays the run instead of failing ``fit``.
        create_run: Makes the run when ``run_id`` is None; returns its id.
        retry_interval: Seconds between attempts while the store is unreachable.
    """

    def __init__(
        self,
        client,
        uri: str,
        run_id: str | None,
        create_run: Callable[[], str],
        retry_interval: float,
    ):
        self.client = client
        self.uri = uri
        self.run_id = run_id
        self.retry_interval = retry_interval
        self.unsent = 0  # values still buffered when close() gave up
        self.dropped = 0  # values the store rejected (not retried)
        self._create_run = create_run
        self._queue: queue.Queue = queue.Queue()
        self._pending: list = []
        self._lock = threading.Lock()
        self._failing = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._drain, name="MLflowLogger", daemon=True)
        self._thread.start()

    def submit(
        self, kind: str, values: dict, step: int | None, timestamp_ms: int | None = None
    ) -> None:
        """Queue ``values`` ("params" or "metrics", at ``step``), stamped ``timestamp_ms``
        (milliseconds since the epoch; defaults to the time now). Safe from any thread."""
        if values:
            stamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
            self._queue.put((kind, values, step, stamp))

    def close(self, timeout: float) -> int:
        """Send what is queued, waiting up to ``timeout`` seconds, and stop the thread.

        Returns:
            How many values could not be sent. Idempotent.
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return self.unsent
        self._deadline = time.monotonic() + timeout
        self._queue.put(None)
        thread.join(timeout + 5)
        with self._lock:
            self.unsent = sum(len(item[1]) for item in self._pending)
        return self.unsent

    def try_create_run(self) -> None:
        """Create the run now if the store answers (otherwise the thread does it later)."""
        if self.run_id is None and self.reachable():
            try:
                self.run_id = self._create_run()
            except Exception as exc:
                self.warn(exc)

    def reachable(self) -> bool:
        """For an HTTP tracking server, a quick ``/health`` check; other stores are just tried."""
        ok, reason = is_reachable(self.uri)
        if not ok:
            self.warn(reason)
        return ok

    def call(self, fn) -> bool:
        """Run ``fn``; a failure is warned about, never raised (logging must not stop training)."""
        try:
            fn()
            return True
        except Exception as exc:
            self.warn(exc)
            return False

    def warn(self, reason) -> None:
        if not self._failing:
            self._failing = True
            warnings.warn(
                f"MLflowLogger: MLflow at {self.uri} is not answering ({reason}); values are "
                f"buffered and retried every {self.retry_interval:g} s. Training continues.",
                stacklevel=2,
            )

    # -- the thread ---------------------------------------------------------------------------
    def _drain(self) -> None:
        closing = False
        while True:
            try:
                wait = self.retry_interval if (self._pending or closing) else None
                item = self._queue.get(timeout=wait)
                while True:  # take everything queued, then send it in few calls
                    if item is None:
                        closing = True
                    else:
                        with self._lock:
                            self._pending.append(item)
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            try:
                self._send_pending()
            except Exception as exc:  # the thread outlives any one failure; values stay pending
                self.warn(exc)
            if closing and (not self._pending or time.monotonic() > self._deadline):
                return

    def _send_pending(self) -> None:
        if not self._pending or not self.reachable():
            return
        if self.run_id is None:
            try:
                self.run_id = self._create_run()
            except Exception as exc:
                self.warn(exc)
                return
        sent = 0
        while self._pending:
            with self._lock:
                chunk = self._next_chunk()
            try:
                self._send(chunk)
            except Exception as exc:
                if not is_rejection(exc):  # unreachable or failing: keep it, retry later
                    self.warn(exc)
                    return
                self.dropped += sum(len(it[1]) for it in chunk)
                warnings.warn(f"MLflowLogger: MLflow rejected {chunk[0][0]} ({exc}).", stacklevel=2)
            with self._lock:
                del self._pending[: len(chunk)]
            sent += sum(len(it[1]) for it in chunk)
        if self._failing:
            self._failing = False
            log.warning("MLflowLogger: MLflow is reachable again; sent %d buffered value(s).", sent)

    def _next_chunk(self) -> list:
        """The params item at the head, or the consecutive metric items that fit one call."""
        head = self._pending[0]
        if head[0] == "params":
            return [head]
        chunk, size = [], 0
        for it in self._pending:
            if it[0] != "metrics" or size + len(it[1]) > _MAX_BATCH and chunk:
                break
            chunk.append(it)
            size += len(it[1])
        return chunk

    def _send(self, chunk: list) -> None:
        if chunk[0][0] == "params":
            params, metrics = [param(k, v) for k, v in chunk[0][1].items()], []
        else:
            params = []
            metrics = [
                metric(k, v, ts, step) for _, vals, step, ts in chunk for k, v in vals.items()
            ]
        send_batch(self.client, self.uri, self.run_id, metrics, params)
