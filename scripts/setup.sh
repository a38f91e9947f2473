#!/usr/bin/env bash
# `make setup`: the Python environment (setup_env.sh: .venv, Horovod) in the foreground, and at the
# same time, in the background, what the tests need from outside Python: Debian's Chromium
# (setup_browser.sh), Prometheus and its Pushgateway (setup_prometheus.sh), and Azurite from npm
# (setup_azurite.sh). The two halves share nothing but the network, so on a fresh machine the
# system half (about 45 s of downloads and unpacking) hides behind the venv's install and Horovod's
# build. Each half's output is printed whole, the system half's after the venv's; either failing
# fails the setup. apt_install.sh waits for dpkg's lock, which setup_env.sh takes only to install
# Java when it is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
(
  set -e
  bash scripts/setup_browser.sh
  bash scripts/setup_prometheus.sh
  bash scripts/setup_azurite.sh
) >"$log" 2>&1 &
system=$!
bash scripts/setup_env.sh
env_rc=$?
wait "$system"
system_rc=$?
cat "$log"
if [ "$system_rc" -ne 0 ]; then
  echo "ERROR: installing the tests' system parts failed (exit $system_rc; see above)." >&2
fi
[ "$env_rc" -eq 0 ] && [ "$system_rc" -eq 0 ]
