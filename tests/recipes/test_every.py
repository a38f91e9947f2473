"""Every recipe ``keras-dl recipes`` lists trains on its own example table, end to end.

The list is the recipes package itself (:func:`keras_dl.recipe.list_recipes`), so a new recipe is
trained here without editing this file; its ``example`` (``recipes/_examples.py``) says which
small table it trains on.
"""

from __future__ import annotations

import math

import pytest

from keras_dl.recipe import list_recipes, load_recipe
from tests.conftest import cli_in_process


def test_the_recipes_command_lists_the_recipes_package():
    out = cli_in_process("recipes")
    assert out.returncode == 0, out.stderr
    listed = [line.split()[0] for line in out.stdout.splitlines() if line[:1].strip()]
    assert listed == list_recipes() and listed  # what this module parametrizes over


@pytest.mark.slow
@pytest.mark.parametrize("name", list_recipes())
def test_every_listed_recipe_trains_on_its_example(name, tmp_path):
    import mlflow

    from keras_dl.config import resolve
    from keras_dl.train import fit

    recipe = load_recipe(name)
    assert recipe.example is not None, f"recipes/{name}.py: give RECIPE an example table"
    table, sets = recipe.example(str(tmp_path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "tracking.registered_model=none",  # one epoch on a tiny table: judged elsewhere
            "train.verbose=0",
            *sets,
        ],
    )
    result = fit(exp, recipe)
    run = mlflow.MlflowClient(uri).get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["data.table"] == table
    losses = mlflow.MlflowClient(uri).get_metric_history(result.run_id, "loss")
    assert len(losses) == exp.train.epochs and all(math.isfinite(m.value) for m in losses)
    assert result.model_uri  # logged with its signature, loadable as a pyfunc
    assert mlflow.models.get_model_info(result.model_uri).signature is not None
