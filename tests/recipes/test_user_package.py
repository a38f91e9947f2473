"""A recipe can live in the user's own package: ``keras-dl train mypkg.recipes.churn``."""

from __future__ import annotations

import sys
import textwrap

import pytest

from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from tests.conftest import cli_in_process

# A team's own recipe: a small MLP that reuses nothing of recipes/ but keras_dl's Recipe.
_CHURN = """
import dataclasses

import keras

from keras_dl.config import Experiment
from keras_dl.recipe import Recipe


def build_model(data, exp):
    inputs = keras.Input(shape=(64,), name="pixels")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Rescaling(1 / 16)(inputs))
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(hidden))


DEFAULTS = Experiment(recipe="churn")
DEFAULTS = dataclasses.replace(
    DEFAULTS, train=dataclasses.replace(DEFAULTS.train, epochs=2, batch_size=64)
)
RECIPE = Recipe(name="churn", description="a team's own recipe", defaults=DEFAULTS,
                build_model=build_model)
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``mypkg.recipes.churn`` on ``sys.path``, removed from the import cache afterwards."""
    folder = tmp_path / "src" / "mypkg" / "recipes"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    (folder / "churn.py").write_text(textwrap.dedent(_CHURN))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield "mypkg.recipes.churn"
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def test_a_dotted_name_loads_the_users_module_and_names_it_in_its_defaults(user_package):
    recipe = load_recipe(user_package)
    assert recipe.description == "a team's own recipe"
    # Ranks, Spark tasks and resumes reload the recipe from exp.recipe: it must be the path.
    assert recipe.defaults.recipe == "mypkg.recipes.churn"


@pytest.mark.slow
def test_a_recipe_of_the_users_own_package_trains_and_registers(
    user_package, digits_table, tmp_path
):
    import mlflow

    from keras_dl.config import resolve
    from keras_dl.train import fit

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = resolve(
        load_recipe(user_package).defaults,
        sets=[
            f"data.table={digits_table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "train.verbose=0",
            "callbacks.plots=false",
        ],
    )
    assert exp.tracking.registered_model == "mypkg.recipes.churn"
    result = fit(exp)  # loads the recipe by exp.recipe, as a rank would
    run = mlflow.MlflowClient(uri).get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["keras_dl.recipe"] == "mypkg.recipes.churn"
    assert result.registered_version == 1, result.not_registered


def test_a_missing_module_of_a_dotted_name_says_what_to_install():
    with pytest.raises(ConfigError, match=r"no module 'nosuchpkg\.recipes\.churn'.*'nosuchpkg'"):
        load_recipe("nosuchpkg.recipes.churn")


def test_the_cli_takes_a_dotted_recipe_name():
    proc = cli_in_process("train", "nosuchpkg.recipes.churn", "--set", "data.table=x")
    assert proc.returncode == 2, proc.stderr
    assert "no module 'nosuchpkg.recipes.churn'" in proc.stderr


def test_a_name_that_is_no_module_path_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"'my-pkg\.churn' is not valid.*dotted module path"):
        load_recipe("my-pkg.churn")


def test_a_missing_builtin_recipe_names_the_file_to_add():
    with pytest.raises(ConfigError, match=r"add recipes/nosuch\.py defining RECIPE"):
        load_recipe("nosuch")
