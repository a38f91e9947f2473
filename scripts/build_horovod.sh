#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI sdist against the TensorFlow in the given venv, and install it.
#
# Upstream Horovod has no TF >= 2.16 support: horovod/tensorflow/xla_mpi_ops.cc does not compile
# against TF 2.21's headers (XLA headers moved), so it is dropped from the CMake sources. The build
# uses Gloo (no MPI) and TensorFlow only. The wheel is cached per (Horovod, TF, Python, this script)
# under ~/.cache/keras-dl so a second environment on the same machine does not rebuild it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$(cd "${1:-$ROOT/.venv}" && pwd)  # absolute: the build below runs in another directory
PY="$VENV/bin/python"
HVD_VERSION=0.28.1

key=$("$PY" - <<'PY'
import sys, tensorflow as tf
print(f"tf{tf.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")
PY
)
script_hash=$(cat "$0" "$ROOT/requirements/horovod.txt" | sha256sum | cut -c1-12)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/keras-dl/horovod-$HVD_VERSION-$key-$script_hash"

if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
  echo ">>> building Horovod $HVD_VERSION against $key (about 1.5 minutes on 2 cores)"
  command -v g++ >/dev/null || { echo "ERROR: g++ is needed to build Horovod (apt-get install g++)." >&2; exit 1; }
  if ! command -v cmake >/dev/null; then
    # Horovod's CMakeLists predate CMake 4's removal of old policies: take a 3.x.
    "$VENV/bin/pip" install -q "cmake>=3.13,<4"
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: --require-hashes \
    -r "$ROOT/requirements/horovod.txt" -d "$work"
  tar -xzf "$work/horovod-$HVD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HVD_VERSION"
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  if grep -q xla_mpi_ops "$src/horovod/tensorflow/CMakeLists.txt"; then
    echo "ERROR: could not drop xla_mpi_ops.cc from Horovod's CMakeLists.txt" >&2; exit 1
  fi
  # Gloo's devices bind the interface HOROVOD_GLOO_IFACE names (horovod.spark sets the hosts'
  # common one), except the global process set's: GlooContext::InitializeForProcessSet builds its
  # device from its own gloo_iface_, which nothing sets, so Gloo binds whatever gethostname()
  # resolves to. Where a host's own name is on 127.0.0.1 in /etc/hosts (a common Linux default),
  # each rank offers its peers 127.0.0.1 and the job aborts (gloo::IoException ... connect
  # [127.0.0.1]:PORT: Connection refused). Take the global context's interface instead.
  gloo_cc="$src/horovod/common/gloo/gloo_context.cc"
  sed -i '/^void GlooContext::InitializeForProcessSet/,/CreateDevice/ s|^  device_attr.iface = gloo_iface_;$|  gloo_iface_ = global_context.gloo_iface_;  // keras_dl: the global interface\
  device_attr.iface = gloo_iface_;|' "$gloo_cc"
  if [ "$(grep -c 'gloo_iface_ = global_context.gloo_iface_;' "$gloo_cc")" != 1 ]; then
    echo "ERROR: could not give Horovod's process sets the global Gloo interface ($gloo_cc)" >&2; exit 1
  fi
  # Horovod builds RelWithDebInfo (-O3 -g): keep -O3, drop the debug info. Measured on 2 cores:
  # 112 s and a 14.8 MB wheel with it, 90 s and 1.0 MB without; the code is the same.
  sed -i 's|^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO .*|&\
string(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\
string(REPLACE "-g" "" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")|' "$src/CMakeLists.txt"
  if ! grep -q 'REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO' "$src/CMakeLists.txt"; then
    echo "ERROR: could not drop -g from Horovod's CMakeLists.txt" >&2; exit 1
  fi
  (cd "$src" && PATH="$VENV/bin:$PATH" \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    "$VENV/bin/pip" wheel -q --no-build-isolation --no-deps -w "$work/dist" .) \
    || { echo "ERROR: building Horovod $HVD_VERSION failed (see the compiler output above)." >&2; exit 1; }
  mkdir -p "$cache"
  cp "$work"/dist/horovod-*.whl "$cache/"
fi

"$VENV/bin/pip" install -q --no-deps --force-reinstall "$cache"/horovod-*.whl
if ! "$PY" -c 'import horovod.tensorflow as hvd; hvd.init(); assert hvd.gloo_built(), "no Gloo"' >/dev/null 2>&1; then
  echo "ERROR: Horovod was built but 'import horovod.tensorflow' fails in $VENV." >&2
  "$PY" -c 'import horovod.tensorflow as hvd; hvd.init()' || true
  echo "Delete $cache and re-run 'make setup' to rebuild it." >&2
  exit 1
fi
echo ">>> Horovod $HVD_VERSION OK ($key)"
