"""Rank 0's live figures, sent to the launcher's process, which serves them to Prometheus.

Under a Horovod launcher (:mod:`keras_dl.launch.metrics_relay`) ``tracking.prometheus_port`` is
served by the driver, where a scraper finds it whichever host rank 0 landed on. Rank 0 POSTs
:meth:`~keras_dl.callbacks.prometheus_export.RunMetrics.snapshot` as JSON (never a pickle) to
the driver's feed URL, which the launcher passes in ``KERAS_DL_PROMETHEUS_FEED``: once a second
while ``fit`` runs, and once more at its end.
"""

from __future__ import annotations

import json
import threading
import urllib.request
import warnings
from collections.abc import Callable

FEED_ENV = "KERAS_DL_PROMETHEUS_FEED"
FEED_SECONDS = 1.0


class FeedSender:
    """POST ``snapshot()`` to ``url`` every ``every`` seconds from a daemon thread.

    A feed that fails is warned about once; training goes on and later posts are tried.
    """

    def __init__(self, url: str, snapshot: Callable[[], dict], every: float = FEED_SECONDS):
        self.url, self.snapshot, self.every = url, snapshot, every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True, name="keras_dl-feed")
            self._thread.start()

    def close(self) -> None:
        """Stop the thread and send the last figures (the run's end state)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.send()

    def send(self) -> bool:
        body = json.dumps(self.snapshot()).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"Prometheus: sending the run's figures to the launcher at {self.url} "
                    f"failed ({exc}); training goes on, later sends are tried.",
                    stacklevel=2,
                )
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.send()
