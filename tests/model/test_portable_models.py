"""Every recipe's logged model loads and predicts in a fresh virtualenv built only from the
model's own ``requirements.txt``: no keras_dl there, the same outputs as in keras_dl's process.

The venv is built once per requirements on a machine, with uv, and kept under ~/.cache/keras-dl
(tests/fresh_venv.py); the test skips, saying so, when uv cannot reach an index.
"""

import pickle
import subprocess
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import STARTS_FIRST, train_digits, write_test_table
from tests.fresh_venv import cached_venv, clean_env

pytestmark = pytest.mark.slow

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


def _digits_model(tmp: Path, digits_table):
    from sklearn.datasets import load_digits

    _, _, uri = train_digits(digits_table, tmp, "train.epochs=1")
    return uri, "models:/digits/1", load_digits().data[:20]


def _tabular_model(tmp: Path, digits_table):
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
    write_test_table(table, pa.Table.from_pandas(frame, preserve_index=False), 100)
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


def _flowers_model(tmp: Path, digits_table):
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


# How each recipe's model is trained here: ``builder(tmp, digits_table) -> (tracking uri, model
# uri, inputs)``. Every recipe list_recipes() finds must have one.
MODELS = {"digits": _digits_model, "tabular": _tabular_model, "flowers": _flowers_model}


@pytest.fixture(scope="module")
def recipe_models(digits_table, tmp_path_factory):
    """Each recipe (:func:`keras_dl.recipe.list_recipes`) trained for one epoch on tiny data, its
    model folder downloaded, and the in-process predictions:
    ``[(recipe, model folder, inputs, predictions)]``."""
    from keras_dl.recipe import list_recipes

    missing = sorted(set(list_recipes()) - set(MODELS))
    assert not missing, f"recipes with no case in MODELS here (add one each): {missing}"
    out = []
    cases = [
        (name, *MODELS[name](tmp_path_factory.mktemp(f"portable_{name}"), digits_table))
        for name in list_recipes()
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
def fresh_venv(recipe_models, tmp_path_factory):
    """A virtualenv holding only the models' ``requirements.txt`` (they are the same file).

    Built once per requirements (and interpreter) on a machine (tests/fresh_venv.py). Nothing
    is ever installed into it but that file; the test still checks that keras_dl is not
    importable there.
    """
    requirements = {
        Path(folder, "requirements.txt").read_text() for _, folder, _, _ in recipe_models
    }
    assert len(requirements) == 1, requirements
    text = requirements.pop()
    assert "keras_dl" not in text
    file = tmp_path_factory.mktemp("portable_requirements") / "requirements.txt"
    file.write_text(text)
    with cached_venv("portable", text, lambda _: ["-r", str(file)]) as python:
        yield python


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
        capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, _, _, expected in recipe_models:
        assert f"predicted {name}" in proc.stdout
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), expected, atol=1e-5)
