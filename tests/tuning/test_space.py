"""The search space: parsed without eval, checked against the recipe's config before any trial."""

from __future__ import annotations

import optuna
import pytest

from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from keras_dl.tuning.space import Dimension, check_space, parse_space, read_space, split_args


@pytest.fixture(scope="module")
def digits():
    return load_recipe("digits").defaults


def test_every_kind_parses_and_applies(digits):
    space = parse_space(
        [
            "train.learning_rate=loguniform(1e-4,1e-1)",
            "model.dropout=uniform(0, 0.5)",
            "train.batch_size=int(16,64)",
            "model.filters=logint(8,64)",
            "train.optimizer=choice(adam,'sgd')",
            "data.image_size=choice([8,8],[16,16])",
        ]
    )
    assert space[0] == Dimension("train.learning_rate", "loguniform", (1e-4, 1e-1))
    assert space[2].args == (16, 64)
    assert space[4].args == ("adam", "sgd")
    assert space[5].args == ("[8,8]", "[16,16]")
    check_space(digits, space)  # every bound and choice is a value its field takes


def test_a_list_choice_reaches_the_field_as_a_tuple(digits):
    from keras_dl.tuning.space import apply_values

    (dim,) = parse_space(["data.image_size=choice([8,8],[16,16])"])
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
    exp = apply_values(digits, {dim.key: dim.suggest(trial)}, origin="test")
    assert exp.data.image_size in ((8, 8), (16, 16))


def test_suggestions_stay_inside_the_bounds():
    space = parse_space(["train.learning_rate=loguniform(1e-4,1e-1)", "train.epochs=int(1,3)"])
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        lr, epochs = (float(space[0].suggest(trial)), int(space[1].suggest(trial)))
        assert 1e-4 <= lr <= 1e-1 and 1 <= epochs <= 3


@pytest.mark.parametrize(
    "item, match",
    [
        ("train.lr=uniform(0,1)", r"Unknown config key 'train\.lr'.*Valid keys in 'train'"),
        ("trian.epochs=int(1,2)", r"Unknown config section 'trian'"),
        ("model.dense=choice(a,b)", r"'model\.dense' got 'a'.*must be an integer"),
        ("model.dropout=uniform(0,2)", r"model\.dropout=2\.0 is outside the allowed range"),
        ("train.optimizer=choice(adam,bogus)", None),  # a str field: checked when fit starts
        ("train.lr_schedule=choice(constant,linear)", r"train\.lr_schedule"),
    ],
)
def test_unknown_keys_and_values_the_field_refuses_are_named(digits, item, match):
    space = parse_space([item])
    if match is None:
        check_space(digits, space)
        return
    with pytest.raises(ConfigError, match=match):
        check_space(digits, space)


@pytest.mark.parametrize(
    "item, match",
    [
        ("learning_rate=uniform(0,1)", "not of the form section.key=KIND"),
        ("train.learning_rate", "not of the form section.key=KIND"),
        ("train.learning_rate=normal(0,1)", "KIND one of uniform, loguniform"),
        ("train.learning_rate=uniform(0,1", "KIND one of"),
        ("train.learning_rate=uniform(1)", r"takes two bounds"),
        ("train.learning_rate=uniform(1,0)", "low < high"),
        ("train.learning_rate=uniform(0,inf)", "finite bounds"),
        ("train.learning_rate=loguniform(0,1)", "low > 0"),
        ("train.learning_rate=uniform(a,1)", "must be numbers"),
        ("train.epochs=int(1.5,3)", "must be integers"),
        ("train.epochs=choice()", "at least one value"),
        ("data.image_size=choice([8,8],[16,16)", "unclosed"),
        ("data.image_size=choice([8,8]],[16])", "unbalanced"),
        ("train.epochs=choice(1,,2)", "an empty value"),
        # Nothing is evaluated: Python in a space is only text, refused by the field's type.
        ("train.epochs=choice(__import__('os').getpid())", "must be an integer"),
    ],
)
def test_bad_spaces_are_named(digits, item, match):
    with pytest.raises(ConfigError, match=match):
        check_space(digits, parse_space([item]))


def test_a_key_twice_and_an_empty_space_are_errors(digits):
    with pytest.raises(ConfigError, match="train.epochs more than once"):
        parse_space(["train.epochs=int(1,2)", "train.epochs=int(2,3)"])
    with pytest.raises(ConfigError, match="search space is empty"):
        check_space(digits, [])


def test_split_args_respects_brackets_and_quotes():
    assert split_args("[64,32],[128,64]", "t") == ["[64,32]", "[128,64]"]
    assert split_args("'a,b', c", "t") == ["'a,b'", "c"]
    assert split_args("", "t") == []


def test_a_yaml_file_flat_or_by_section(tmp_path, digits):
    path = tmp_path / "space.yaml"
    path.write_text("train.learning_rate: loguniform(1e-4,1e-1)\nmodel:\n  dense: choice(64,128)\n")
    space = read_space(path)
    assert [d.key for d in space] == ["train.learning_rate", "model.dense"]
    check_space(digits, space)
    path.write_text("train.epochs: [1, 2]\n")
    with pytest.raises(ConfigError, match="must be KIND\\(ARGS\\) text"):
        read_space(path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_space(tmp_path / "missing.yaml")


def test_tune_settings_are_config_keys(digits):
    from keras_dl.config import resolve

    exp = resolve(digits, sets=["tune.trials=8", "tune.parallelism=2"])
    assert (exp.tune.trials, exp.tune.parallelism) == (8, 2)
    with pytest.raises(ConfigError, match="tune.trials"):
        resolve(digits, sets=["tune.trials=0"])
    with pytest.raises(ConfigError, match="tune.direction"):
        resolve(digits, sets=["tune.direction=up"])


def test_the_cli_names_a_bad_space_and_exits_2_before_any_work(tmp_path):
    from tests.conftest import cli_in_process

    proc = cli_in_process(
        "tune", "digits", "--trials", "2", "--space", "train.lr=loguniform(1e-4,1e-1)",
        "--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Unknown config key 'train.lr'" in proc.stderr and "train.learning_rate" in proc.stderr
    assert not list(tmp_path.iterdir())  # no store, no journal, no run folder
