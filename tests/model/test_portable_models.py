"""Every recipe's logged model loads and predicts in a fresh virtualenv built only from the
model's own ``requirements.txt``: no keras_dl there, the same outputs as in keras_dl's process.

The venv is built once per requirements on a machine, with uv, and kept under ~/.cache/keras-dl
(uv reaches the package index, or its local cache); the test skips, saying so, when uv cannot
reach an index.
"""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import STARTS_FIRST, train_digits, write_delta
from tests.warm_python import REAL_PYTHON

pytestmark = pytest.mark.slow

UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Connection refused",
    "dns error",
    "error sending request",
)

VENV_SCRIPT = """
import importlib.util, pickle, sys
import numpy as np
import mlflow

assert importlib.util.find_spec("keras_dl") is None, "keras_dl is importable in the fresh venv"
for name, model_dir, inputs_file, out_file in pickle.load(open(sys.argv[1], "rb")):
    model = mlflow.pyfunc.load_model(model_dir)
    np.save(out_file, np.asarray(model.predict(pickle.load(open(inputs_file, "rb")))))
    print("predicted", name)
"""


def _tabular_model(tmp: Path):
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame(
        {
            "size": rng.normal(50.0, 20.0, n),
            "rooms": rng.integers(1, 6, n).astype(np.int64),
            "city": rng.choice(["north", "south", "east"], n),
        }
    )
    frame["tier"] = np.where(frame["size"] > 50, "high", "low")
    table = str(tmp / "houses")
    write_delta(table, pa.Table.from_pandas(frame, preserve_index=False), 100)
    recipe = load_recipe("tabular")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            "data.label=tier",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp / 'run'}",
            "train.epochs=1",
            "train.verbose=0",
        ],
    )
    fit(exp, recipe)
    return uri, "models:/tabular/1", frame[["size", "rooms", "city"]].head(20)


def _flowers_model(tmp: Path):
    import tensorflow_datasets as tfds

    from keras_dl.config import resolve
    from keras_dl.data.ingest.tfds import ingest_tfds
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    table = str(tmp / "flowers")
    with tfds.testing.mock_data(num_examples=20):
        ingest_tfds(
            "tf_flowers", table, splits=["train"], resplit=(0.6, 0.2, 0.2), rows_per_group=8
        )
    recipe = load_recipe("flowers")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp / 'run'}",
            "data.image_size=32,32",
            "model.alpha=0.35",
            "model.weights=none",
            "train.batch_size=4",
            "train.epochs=1",
            "train.verbose=0",
        ],
    )
    result = fit(exp, recipe)
    images = np.random.default_rng(0).uniform(0, 255, (3, 32, 32, 3))
    # TFDS's mock labels are random: the gate may refuse this model; it is logged either way.
    return uri, result.model_uri, images


@pytest.fixture(scope="module")
def recipe_models(digits_table, tmp_path_factory):
    """Each recipe trained for one epoch on tiny data, its model folder downloaded, and the
    in-process predictions: ``[(recipe, model folder, inputs, predictions)]``."""
    from sklearn.datasets import load_digits

    out = []
    digits_tmp = tmp_path_factory.mktemp("portable_digits")
    _, result, digits_uri = train_digits(digits_table, digits_tmp, "train.epochs=1")
    cases = [
        ("digits", digits_uri, "models:/digits/1", load_digits().data[:20]),
        ("tabular", *_tabular_model(tmp_path_factory.mktemp("portable_tabular"))),
        ("flowers", *_flowers_model(tmp_path_factory.mktemp("portable_flowers"))),
    ]
    for name, uri, model_uri, inputs in cases:
        mlflow.set_tracking_uri(uri)
        folder = mlflow.artifacts.download_artifacts(
            model_uri, dst_path=str(tmp_path_factory.mktemp(f"model_{name}"))
        )
        predictions = np.asarray(mlflow.pyfunc.load_model(folder).predict(inputs))
        out.append((name, folder, inputs, predictions))
    return out


@pytest.fixture(scope="module")
def fresh_venv(recipe_models):
    """A virtualenv holding only the models' ``requirements.txt`` (they are the same file).

    Built once per requirements (and interpreter) on a machine, under ``~/.cache/keras-dl`` as
    the Horovod wheel is (scripts/build_horovod.sh). Nothing is ever installed into it but that
    file; it counts only once the install finished (a
    ``.complete`` file), and the test still checks that keras_dl is not importable there.
    Venvs of other requirements that no test process holds are deleted when one is built.
    """
    import fcntl
    import hashlib

    requirements = {
        Path(folder, "requirements.txt").read_text() for _, folder, _, _ in recipe_models
    }
    assert len(requirements) == 1, requirements
    text = requirements.pop()
    assert "keras_dl" not in text
    key = hashlib.sha256(f"{sys.version}\n{REAL_PYTHON}\n{text}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "keras-dl")
    venv = cache / f"portable-venv-{key}"
    python = venv / "bin" / "python"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"portable-venv-{key}.lock", "w") as lock:
        # Held shared while in use (no other test process deletes it meanwhile), exclusive
        # while it is built (another test process may be building it).
        fcntl.flock(lock, fcntl.LOCK_SH)
        if not ((venv / ".complete").is_file() and python.exists()):
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not ((venv / ".complete").is_file() and python.exists()):
                _build_venv(venv, text, cache)
            fcntl.flock(lock, fcntl.LOCK_SH)
        yield python


def _build_venv(venv: Path, requirements: str, cache: Path) -> None:
    import shutil

    shutil.rmtree(venv, ignore_errors=True)  # an unfinished build
    _remove_other_venvs(cache, keep=venv.name)  # 2.3 GB each: only the one in use is kept
    # uv (a dev dependency) builds the venv and installs the file: seconds, where pip took
    # 4-5 minutes of the suite installing TensorFlow. What lands in the venv is the same.
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "-q", "--python", REAL_PYTHON, str(venv)], check=True)
    (venv / "requirements.txt").write_text(requirements)
    install = subprocess.run(
        [*uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r",
         str(venv / "requirements.txt")],
        capture_output=True, text=True, env=_clean_env(),
    )  # fmt: skip
    if install.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        if any(s in install.stderr for s in UNREACHABLE):
            pytest.skip(f"uv cannot reach a package index: {install.stderr.strip()[-500:]}")
        raise AssertionError(
            f"uv pip install -r requirements.txt failed:\n{install.stderr[-3000:]}"
        )
    (venv / ".complete").write_text(requirements)


def _remove_other_venvs(cache: Path, keep: str) -> None:
    """Delete the cached venvs of other requirements that no test process is using now."""
    import fcntl
    import shutil

    for lock_path in cache.glob("portable-venv-*.lock"):
        if lock_path.stem == keep:
            continue
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built or used
            shutil.rmtree(cache / lock_path.stem, ignore_errors=True)
            lock_path.unlink()


def _clean_env() -> dict:
    """The environment without keras_dl's code on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}


@STARTS_FIRST
def test_each_recipe_model_predicts_the_same_in_a_fresh_venv(recipe_models, fresh_venv, tmp_path):
    for _, folder, _, _ in recipe_models:
        text = Path(folder, "MLmodel").read_text()
        assert "loader_module: keras_dl_pyfunc" in text and "code: code" in text
        assert Path(folder, "code", "keras_dl_pyfunc.py").is_file()
    jobs = []
    for name, folder, inputs, _ in recipe_models:
        with open(tmp_path / f"{name}.in.pkl", "wb") as f:
            pickle.dump(inputs, f)
        jobs.append((name, folder, str(tmp_path / f"{name}.in.pkl"), str(tmp_path / f"{name}.npy")))
    with open(tmp_path / "jobs.pkl", "wb") as f:
        pickle.dump(jobs, f)
    (tmp_path / "score.py").write_text(VENV_SCRIPT)
    proc = subprocess.run(
        [str(fresh_venv), str(tmp_path / "score.py"), str(tmp_path / "jobs.pkl")],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, _, _, expected in recipe_models:
        assert f"predicted {name}" in proc.stdout
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), expected, atol=1e-5)
