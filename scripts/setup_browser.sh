#!/usr/bin/env bash
# Chromium, headless, for the run report's test (tests/report/test_report.py renders report.html in it).
# Debian's package; skipped when a chromium is already on the PATH. Separate from setup_env.sh,
# whose hash decides when .venv is rebuilt: a browser is not part of the Python environment.
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "WARNING: no chromium and no apt-get: tests/report/test_report.py needs a headless Chromium on the PATH." >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "WARNING: installing Chromium needs root: run 'sudo apt-get install -y chromium' (tests/report/test_report.py needs it)." >&2
    exit 0
  fi
fi
echo ">>> installing Chromium (headless) for the report test"
$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
