"""The Prometheus settings of ``tracking``: a port, an IPv4 address to bind, a Pushgateway URL."""

from __future__ import annotations

import ipaddress
import urllib.parse

from keras_dl.config.schema import TrackingConfig
from keras_dl.errors import ConfigError


def check_prometheus(tracking: TrackingConfig) -> None:
    """Raise :class:`ConfigError` naming the ``tracking.prometheus_*`` key that is wrong."""
    port = tracking.prometheus_port
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(
            f"tracking.prometheus_port={port} is not a TCP port: use 0 to 65535 (0 picks a free "
            "port and prints it), e.g. --set tracking.prometheus_port=9464, or leave it unset "
            "(off)."
        )
    try:
        ipaddress.IPv4Address(tracking.prometheus_bind)
    except ValueError:
        raise ConfigError(
            f"tracking.prometheus_bind={tracking.prometheus_bind!r} is not an IPv4 address: use "
            "127.0.0.1 (the default, this host only) or 0.0.0.0 (every interface)."
        ) from None
    url = tracking.prometheus_pushgateway
    if url:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"tracking.prometheus_pushgateway={url!r} is not an http(s) URL of a "
                "Pushgateway, e.g. --set tracking.prometheus_pushgateway=http://127.0.0.1:9091."
            )
    seconds = tracking.prometheus_final_scrape_seconds
    if not seconds >= 0:
        raise ConfigError(
            f"tracking.prometheus_final_scrape_seconds={seconds:g} must be 0 (no wait) or more, "
            "e.g. --set tracking.prometheus_final_scrape_seconds=30."
        )
