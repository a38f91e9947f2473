#!/usr/bin/env bash
# Create or refresh .venv with the pinned stack. Idempotent: it does nothing when the environment
# matches setup.cfg + requirements/, and rebuilds it from scratch when any of them changed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=.venv
STAMP="$VENV/.keras-dl-env"
want=$(cat setup.cfg pyproject.toml requirements/*.txt scripts/setup_env.sh scripts/build_horovod.sh | sha256sum | cut -c1-16)

# The package's .pth file (the import hooks every Python process of the venv registers at start).
copy_pth() {
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cmp -s keras_dl_petastorm_compat.pth "$site/keras_dl_petastorm_compat.pth" \
    || cp keras_dl_petastorm_compat.pth "$site/"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c 'import keras_dl' 2>/dev/null; then
  copy_pth
  exit 0
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(not ((3,10) <= sys.version_info[:2] <= (3,12)))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { echo "ERROR: keras-dl needs Python 3.10-3.12 (TensorFlow 2.21). Install python3.11." >&2; exit 1; }

if ! command -v java >/dev/null; then
  echo ">>> installing Java 17 for Spark"
  if command -v apt-get >/dev/null; then
    # make setup installs Debian packages beside this (scripts/setup.sh): wait for dpkg's lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq \
      && apt-get -o DPkg::Lock::Timeout=600 install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "ERROR: Spark needs Java 17 and apt-get is not available: install a JRE 17." >&2; exit 1
  fi
fi

echo ">>> creating $VENV with $($PY --version)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
extra=cpu
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then extra=gpu; fi
# Every extra: the suite tests each optional part (setup.cfg extras_require).
extras="$extra,spark,azure,s3,tune,monitoring,images,dev,bench"
echo ">>> installing keras-dl[$extras] with the pins in requirements/constraints.txt"
# With uv (pinned like everything else), which downloads and unpacks the wheels in parallel: on a
# fresh machine the same install took pip 112 s and uv 44 s (bytecode included). --compile-bytecode as pip does, so
# the suite's first parallel imports do not each compile TensorFlow. pip stays in the venv for
# build_horovod.sh and for users.
"$VENV/bin/pip" install -q -c requirements/constraints.txt uv
"$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" \
  -c requirements/constraints.txt -e ".[$extras]"
# An editable install does not ship the package's .pth file (a wheel does): copy it, so every
# Python process of the venv (Petastorm's process pool, Spark's Python workers, Horovod ranks)
# registers the import hooks (the top-level keras_dl_petastorm_hook and keras_dl_keras_hook, not
# keras_dl) before anything imports Petastorm or Keras (the Keras one only acts with
# KERAS_DL_DEFER_KERAS_EXTRAS=1).
copy_pth
bash scripts/build_horovod.sh "$VENV"
"$VENV/bin/python" -c 'import tensorflow, keras, petastorm, deltalake, mlflow, pyspark, keras_dl' \
  || { echo "ERROR: the environment in $VENV does not import its core packages." >&2; exit 1; }
echo "$want" > "$STAMP"
echo ">>> environment ready in $VENV"
