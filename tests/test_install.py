"""keras-dl as a user installs it: the wheel of this checkout, ``[cpu]`` only, in a fresh venv
without PySpark, ingests digits and trains and registers the digits recipe (README, "Install").

The venv's dependencies are installed once per setup.cfg and pins (tests/fresh_venv.py, with
uv's cache: about 25 s the first time on this machine); every run installs this checkout's
wheel into it again, holding the venv alone meanwhile.
"""

from __future__ import annotations

import subprocess
import zipfile

import mlflow
import pytest

from tests.conftest import REPO
from tests.fresh_venv import cached_venv, clean_env, run_uv

pytestmark = pytest.mark.slow

# What the venv's dependencies follow from.
DEPENDENCY_FILES = (
    "setup.cfg",
    "setup.py",
    "pyproject.toml",
    "requirements/constraints.txt",
    "requirements/without-spark.txt",
)


def test_a_core_install_trains_and_registers_digits_without_spark(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {"keras_dl", "recipes", "keras_dl_petastorm_compat.pth"} <= tops, tops
    assert not tops & {"benchmarks", "tests", "notebooks", "scripts"}, tops

    key = "\n".join((REPO / f).read_text() for f in DEPENDENCY_FILES)
    with cached_venv("install", key, lambda _: _install_args(wheel), exclusive=True) as python:
        # This checkout's code, not the one the venv was first built with (same version number).
        run_uv("pip", "install", "-q", "--python", str(python), "--no-deps", "--reinstall",
               "--compile-bytecode", str(wheel))  # fmt: skip
        venv_bin = python.parent

        def run(*cmd: str, timeout: float = 900) -> subprocess.CompletedProcess:
            return subprocess.run(
                cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=timeout
            )

        found = run(
            str(python),
            "-c",
            "import keras_dl, recipes; print(keras_dl.__file__, recipes.__file__)",
        )
        assert found.returncode == 0 and str(REPO) not in found.stdout, found.stdout + found.stderr
        assert str(venv_bin.parent) in found.stdout, found.stdout
        spark = run(str(python), "-c", "import pyspark")
        assert "No module named 'pyspark'" in spark.stderr, (
            spark.stderr
        )  # no Spark session can start

        table, uri = str(tmp_path / "T"), f"sqlite:///{tmp_path / 'mlflow.db'}"
        ingest = run(str(venv_bin / "keras-dl"), "ingest", "sklearn-digits", "--to", table)
        assert ingest.returncode == 0, ingest.stderr[-3000:]
        train = run(str(python), "-m", "recipes.digits", "--set", f"data.table={table}",
                    "--set", "train.epochs=1", "--set", "train.verbose=0",
                    "--set", f"tracking.uri={uri}")  # fmt: skip
        assert train.returncode == 0, train.stderr[-3000:]
        assert "registered model: models:/digits/1" in train.stdout, train.stdout

        bench = run(str(venv_bin / "keras-dl"), "bench", "input")
        assert bench.returncode == 2 and "source checkout" in bench.stderr, bench.stderr
    version = mlflow.MlflowClient(uri).get_model_version("digits", "1")
    assert version.tags["data.table"] == table


def _build_wheel(out) -> str:
    """This checkout's wheel, built with the setuptools of the suite's venv (no index needed)."""
    run_uv("build", "-q", "--wheel", "--no-build-isolation", "--python", _suite_python(),
           "-o", str(out), str(REPO))  # fmt: skip
    (wheel,) = out.glob("keras_dl-*.whl")
    return str(wheel)


def _install_args(wheel: str) -> list[str]:
    """``uv pip install`` of the README's core line, without PySpark (Petastorm requires it)."""
    return [
        "--compile-bytecode",
        "-c", str(REPO / "requirements" / "constraints.txt"),
        "--excludes", str(REPO / "requirements" / "without-spark.txt"),
        f"{wheel}[cpu]",
    ]  # fmt: skip


def _suite_python() -> str:
    """The suite venv's interpreter itself (``sys.executable`` may be the warm launcher)."""
    import sys
    from pathlib import Path

    return str(Path(sys.prefix, "bin", "python"))
