"""``tracking.prometheus_port`` of a Horovod job, served by the driver (the launcher's process).

Rank 0 runs on whichever host the launcher or Spark put it; a scraper's target must not move
with it. So the driver serves ``/metrics`` on ``tracking.prometheus_bind``:``prometheus_port``
for the whole job (its restarts included), and a second small endpoint, the feed, where rank 0
POSTs every rank's figures as JSON (:mod:`keras_dl.callbacks.prometheus_feed`) once a second.
The feed listens on loopback for ranks on this host; for a job whose ranks run on other hosts,
on the address the executors reach the driver at (``spark.driver.host``), which it says.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from keras_dl.callbacks.prometheus_export import RunMetrics
from keras_dl.callbacks.prometheus_feed import FEED_ENV

log = logging.getLogger(__name__)
_MAX_BODY = 4 * 1024 * 1024  # a snapshot is a few kB per rank


class MetricsRelay:
    """The driver's ``/metrics`` of one run, fed by its rank 0.

    Args:
        run_id: The MLflow run (every series' ``run_id``).
        recipe: The recipe's name (every series' ``recipe``).
        port: The port served (0: a free one, printed).
        bind: The address served on (``tracking.prometheus_bind``).
        feed_bind: The address the feed listens on: loopback, or one the ranks' hosts reach.
        final_scrape_seconds: At :meth:`close`, how long to wait for one more scrape.
    """

    def __init__(
        self,
        run_id: str,
        recipe: str,
        port: int,
        bind: str,
        feed_bind: str,
        final_scrape_seconds: float = 0.0,
    ):
        self.metrics = RunMetrics(run_id, recipe)
        self.port, self.bind, self.feed_bind = port, bind, feed_bind
        self.final_scrape_seconds = final_scrape_seconds
        self.served_port: int | None = None
        self._feed: ThreadingHTTPServer | None = None

    def start(self) -> dict[str, str]:
        """Serve ``/metrics`` and the feed; return the ranks' environment (the feed's URL)."""
        self.served_port = self.metrics.serve(self.port, self.bind)
        self._feed = ThreadingHTTPServer((self.feed_bind, 0), _handler(self.metrics))
        self._feed.daemon_threads = True
        threading.Thread(target=self._feed.serve_forever, daemon=True, name="keras_dl-feed").start()
        url = f"http://{self.feed_bind}:{self._feed.server_address[1]}/feed"
        print(
            f"Prometheus metrics of run {self.metrics.run_id}: "
            f"http://{self.bind}:{self.served_port}/metrics (served by the launcher)",
            flush=True,
        )
        return {FEED_ENV: url}

    def close(self) -> None:
        """Give the scraper its last look (up to ``final_scrape_seconds``), stop serving."""
        if self._feed is None:
            return
        self._feed.shutdown()
        self._feed.server_close()
        self._feed = None
        self.metrics.wait_for_scrape(self.final_scrape_seconds)
        self.metrics.stop_serving()

    def __enter__(self) -> MetricsRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _handler(metrics: RunMetrics):
    class Feed(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/feed" or not 0 < length <= _MAX_BODY:
                self.send_error(400, "POST a JSON snapshot to /feed")
                return
            try:
                snapshot = json.loads(self.rfile.read(length))
                if not isinstance(snapshot, dict):
                    raise ValueError("not a JSON object")
                metrics.load(snapshot)
            except (ValueError, TypeError, AttributeError) as exc:
                self.send_error(400, f"not a metrics snapshot: {exc}")
                return
            self.send_response(204)
            self.end_headers()

        def log_message(self, format, *args):  # noqa: A002 - quiet: one POST a second
            log.debug("feed %s: " + format, self.client_address[0], *args)

    return Feed
