"""model.init_from: one key every recipe's model section has, kept on the Experiment."""

import pytest

from keras_dl.config import dumps, read_yaml, resolve, to_flat_dict, valid_keys
from keras_dl.errors import ConfigError
from keras_dl.recipe import list_recipes, load_recipe

SETS = ["data.table=/tmp/t"]


@pytest.mark.parametrize("name", list_recipes())
def test_every_recipe_takes_model_init_from(name):
    defaults = load_recipe(name).defaults
    exp = resolve(defaults, sets=[*SETS, "model.init_from=models:/digits@champion"])
    assert exp.init_from == "models:/digits@champion"
    assert exp.model == resolve(defaults, sets=SETS).model  # the recipe's own section unchanged
    assert to_flat_dict(exp)["model.init_from"] == "models:/digits@champion"
    assert "model.init_from" in valid_keys(exp)
    assert resolve(defaults, sets=SETS).init_from == ""


def test_the_saved_config_reads_back_with_init_from(tmp_path):
    defaults = load_recipe("digits").defaults
    exp = resolve(defaults, sets=[*SETS, "model.init_from=models:/digits/3", "model.dropout=0.2"])
    path = tmp_path / "config.yaml"
    path.write_text(dumps(exp))
    assert read_yaml(path)["model"]["init_from"] == "models:/digits/3"
    assert resolve(defaults, config_file=path) == exp


@pytest.mark.parametrize(
    "item, message",
    [
        ("model.init_from=digits@champion", r"model.init_from='digits@champion' is not a regis"),
        ("model.init_from=models:/digits", r"use models:/NAME@ALIAS or models:/NAME/VERSION"),
        ("model.init_frm=models:/digits/1", r"Unknown config key 'model.init_frm'.*init_from"),
    ],
)
def test_bad_init_from_is_refused_by_name(item, message):
    with pytest.raises(ConfigError, match=message):
        resolve(load_recipe("digits").defaults, sets=[*SETS, item])
