"""Fresh virtualenvs for the tests that install something as a user would, built with uv once
per key on a machine and kept under ``~/.cache/keras-dl`` (as the Horovod wheel is).

uv installs TensorFlow from its cache in seconds, where pip took 4-5 minutes of the suite; it
reaches the package index (or its local cache), and a test skips, saying so, when it cannot.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.warm_python import REAL_PYTHON

UV = [sys.executable, "-m", "uv"]  # a dev dependency, pinned in requirements/constraints.txt
UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Connection refused",
    "dns error",
    "error sending request",
)


@contextlib.contextmanager
def cached_venv(
    kind: str, key_text: str, install: Callable[[Path], list[str]], *, exclusive: bool = False
) -> Iterator[Path]:
    """The python of the venv ``<kind>-venv-<hash of key_text>``, built once with ``install``.

    Args:
        kind: Which tests' venv (``portable``, ``install``): a build deletes the other venvs of
            its kind that no test process holds (2.2 GB each), not other kinds'.
        key_text: Everything the venv's contents follow from (requirement files, setup.cfg);
            the interpreter is added.
        install: Given the venv's python, the arguments of ``uv pip install`` that fill it.
        exclusive: Hold the venv alone while in use (a test that reinstalls a package into it);
            otherwise it is held shared, so no build deletes it meanwhile.

    The venv counts only once its install finished (a ``.complete`` file).
    """
    key = hashlib.sha256(f"{sys.version}\n{REAL_PYTHON}\n{key_text}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "keras-dl")
    venv = cache / f"{kind}-venv-{key}"
    python = venv / "bin" / "python"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{venv.name}.lock", "w") as lock:
        # Exclusive while it is built (another test process may be building it).
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not ((venv / ".complete").is_file() and python.exists()):
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not ((venv / ".complete").is_file() and python.exists()):
                _build(venv, kind, cache, install)
            if not exclusive:
                fcntl.flock(lock, fcntl.LOCK_SH)
        yield python


def run_uv(*args: str) -> subprocess.CompletedProcess:
    """``uv ARGS`` with the checkout's code off the path; skips the test when uv cannot reach
    a package index, and fails it with uv's output on any other error."""
    proc = subprocess.run([*UV, *args], capture_output=True, text=True, env=clean_env())
    if proc.returncode != 0:
        if any(s in proc.stderr for s in UNREACHABLE):
            pytest.skip(f"uv cannot reach a package index: {proc.stderr.strip()[-500:]}")
        raise AssertionError(f"uv {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def clean_env() -> dict:
    """The environment without keras_dl's code on the path, the suite's MLflow store nor the
    suite's opt-in Keras import hook: what a user's fresh venv sees."""
    drop = ("PYTHONPATH", "MLFLOW_TRACKING_URI", "KERAS_DL_DEFER_KERAS_EXTRAS")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _build(venv: Path, kind: str, cache: Path, install: Callable[[Path], list[str]]) -> None:
    shutil.rmtree(venv, ignore_errors=True)  # an unfinished build
    _remove_other_venvs(cache, kind, keep=venv.name)
    subprocess.run([*UV, "venv", "-q", "--python", REAL_PYTHON, str(venv)], check=True)
    python = venv / "bin" / "python"
    try:
        run_uv("pip", "install", "-q", "--python", str(python), *install(python))
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    (venv / ".complete").write_text("")


def _remove_other_venvs(cache: Path, kind: str, keep: str) -> None:
    """Delete the cached venvs of ``kind`` but other keys that no test process is using now."""
    for lock_path in cache.glob(f"{kind}-venv-*.lock"):
        if lock_path.stem == keep:
            continue
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built or used
            shutil.rmtree(cache / lock_path.stem, ignore_errors=True)
            lock_path.unlink()
