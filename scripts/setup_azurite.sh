#!/usr/bin/env bash
# Azurite, Azure Storage's emulator (npm), for the Azure tests (tests/azurite.py starts it on a
# loopback port). Installed with npm into a versioned prefix in the user's cache, shared by every
# clone and worktree of the project on this host, never globally; skipped when that version is
# already there. Separate from setup_env.sh, whose hash decides when .venv is rebuilt: a Node
# program is not part of the Python environment.
#   Where: $KERAS_DL_AZURITE_HOME, else ${XDG_CACHE_HOME:-~/.cache}/keras-dl/azurite-<version>;
#   benchmarks/remote_store.py (which tests/azurite.py uses) looks in the same place, and on the PATH.
set -euo pipefail
VERSION=3.37.0  # benchmarks/remote_store.py AZURITE_VERSION
PREFIX=${KERAS_DL_AZURITE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/keras-dl/azurite-$VERSION}
BIN="$PREFIX/node_modules/.bin/azurite-blob"
if [ -x "$BIN" ] && [ -f "$PREFIX/.installed" ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "WARNING: no npm: the Azure tests (tests/storage/test_azure.py, tests/runlock/test_azure_lease.py)" \
    "need Azurite: install Node.js 20+ and run 'bash scripts/setup_azurite.sh'." >&2
  exit 0
fi
echo ">>> installing Azurite $VERSION (npm) into $PREFIX"
mkdir -p "$PREFIX"
# --no-save/--no-package-lock: the prefix holds node_modules only. Azurite 3.37 declares
# node >= 22 but runs its blob service on Node 20 (checked here): the engine check only warns.
npm install --prefix "$PREFIX" --no-save --no-package-lock --no-audit --no-fund \
  --loglevel=error "azurite@$VERSION" >/dev/null
"$BIN" --version >/dev/null
touch "$PREFIX/.installed"
echo ">>> Azurite ready: $BIN"
