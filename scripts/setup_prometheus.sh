#!/usr/bin/env bash
# Prometheus and its Pushgateway, for the monitoring tests (tests/callbacks/test_prometheus_server.py
# scrapes a run and reads a push back; they skip when the binaries are missing). Debian's
# packages; skipped when both are already on the PATH. Only the binaries are used: the tests
# start their own servers on loopback, with data in a temporary folder.
set -euo pipefail
if command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "WARNING: no prometheus and no apt-get: tests/callbacks/test_prometheus_server.py needs prometheus and prometheus-pushgateway on the PATH." >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "WARNING: installing Prometheus needs root: run 'sudo apt-get install -y prometheus prometheus-pushgateway' (tests/callbacks/test_prometheus_server.py needs them)." >&2
    exit 0
  fi
fi
echo ">>> installing Prometheus and its Pushgateway for the monitoring tests"
# --no-install-recommends: the node exporter and its timers are not needed.
$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
  --no-install-recommends prometheus prometheus-pushgateway >/dev/null
