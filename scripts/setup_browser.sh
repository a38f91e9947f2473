#!/usr/bin/env bash
# Chromium, headless, for the run report's test (tests/report/test_report.py renders report.html in it).
# Debian's package; skipped when a chromium is already on the PATH. Separate from setup_env.sh,
# whose hash decides when .venv is rebuilt: a browser is not part of the Python environment.
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  exit 0
fi
source "$(dirname "$0")/apt_install.sh"
apt_install "Chromium (headless) for the report test" tests/report/test_report.py chromium
