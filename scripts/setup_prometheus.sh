#!/usr/bin/env bash
# Prometheus and its Pushgateway, for the monitoring tests (tests/callbacks/test_prometheus_server.py
# scrapes a run and reads a push back; each test skips when its binary is missing). Debian's
# packages; skipped when both are already on the PATH. Only the binaries are used: the tests
# start their own servers on loopback, with their data in a temporary folder.
set -euo pipefail
if command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null; then
  exit 0
fi
source "$(dirname "$0")/apt_install.sh"
# Without the recommended node exporter and its timers: the tests use neither.
apt_install "Prometheus and its Pushgateway for the monitoring tests" \
  tests/callbacks/test_prometheus_server.py --no-install-recommends prometheus prometheus-pushgateway
