"""Choices come from the schema's types: every ``Literal[...]`` field refuses a value outside it,
naming the key, the value and the values allowed, however the value got there."""

import dataclasses
import re
import typing
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_dl.config import DataConfig, Experiment, TrainConfig, resolve
from keras_dl.errors import ConfigError


def _literal_fields() -> list[tuple[str, str, tuple]]:
    """Every ``(section, key, allowed values)`` of the schema typed ``Literal[...]``, found from
    the types themselves, so a new choice field is tested without editing a list here."""
    found = []
    for section, value in Experiment().sections().items():
        hints = typing.get_type_hints(type(value))
        for f in dataclasses.fields(value):
            if typing.get_origin(hints[f.name]) is Literal:
                found.append((section, f.name, typing.get_args(hints[f.name])))
    return found


LITERAL_FIELDS = _literal_fields()
IDS = [f"{section}.{key}" for section, key, _ in LITERAL_FIELDS]


def defaults(**sections) -> Experiment:
    base = Experiment(recipe="toy", data=DataConfig(table="/tmp/t"), train=TrainConfig(epochs=2))
    return dataclasses.replace(base, **sections)


def _refusal(section: str, key: str, bad: object, allowed: tuple) -> str:
    """The error's meaning as a pattern: the key, the bad value, then every allowed value."""
    listed = ", ".join(re.escape(str(a)) for a in allowed)
    return rf"{section}\.{key}={re.escape(repr(bad))} is not one of {listed}\b"


def test_the_settings_with_choices_are_typed_as_literals():
    keys = {f"{section}.{key}" for section, key, _ in LITERAL_FIELDS}
    assert {
        "data.cache",
        "data.on_bad_image",
        "train.lr_schedule",
        "runtime.strategy",
        "runtime.lr_scaling",
        "callbacks.mode",
    } <= keys
    for section, key, allowed in LITERAL_FIELDS:  # each default is one of its choices
        assert getattr(getattr(Experiment(), section), key) in allowed


@pytest.mark.parametrize("section, key, allowed", LITERAL_FIELDS, ids=IDS)
@pytest.mark.parametrize("bad", ["spaceship", "", "AUTO", "null", "1"])
def test_a_value_outside_a_literal_is_refused_naming_the_key(section, key, allowed, bad):
    assert bad not in allowed
    with pytest.raises(ConfigError, match=_refusal(section, key, bad, allowed)) as err:
        resolve(defaults(), sets=[f"{section}.{key}={bad}"])
    assert f"--set {section}.{key}=" in str(err.value)  # and how to fix it


@pytest.mark.parametrize("section, key, allowed", LITERAL_FIELDS, ids=IDS)
def test_a_recipe_default_outside_a_literal_is_refused_too(section, key, allowed):
    """Values set in Python (a recipe's defaults) skip the parser, not the check."""
    exp = defaults()
    bad = dataclasses.replace(getattr(exp, section), **{key: "spaceship"})
    with pytest.raises(ConfigError, match=_refusal(section, key, "spaceship", allowed)):
        resolve(dataclasses.replace(exp, **{section: bad}))


@pytest.mark.parametrize("section, key, allowed", LITERAL_FIELDS, ids=IDS)
def test_every_value_of_a_literal_is_accepted(section, key, allowed):
    for value in allowed:
        exp = resolve(defaults(), sets=[f"{section}.{key}={value}"])
        assert getattr(getattr(exp, section), key) == value


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(LITERAL_FIELDS), text=st.text(max_size=12))
def test_any_text_outside_a_literal_is_refused(field, text):
    section, key, allowed = field
    sets = [f"{section}.{key}={text}"]
    if text.strip() in allowed:  # --set strips the value
        assert getattr(getattr(resolve(defaults(), sets=sets), section), key) == text.strip()
        return
    with pytest.raises(ConfigError, match=_refusal(section, key, text.strip(), allowed)):
        resolve(defaults(), sets=sets)


@dataclasses.dataclass(frozen=True)
class ChoiceModel:
    """A recipe's model section: choices in it are checked like the schema's."""

    kind: Literal["a", "b"] = "a"
    maybe: Literal["x", "y"] | None = None
    many: tuple[Literal["p", "q"], ...] = ("p",)
    level: Literal[0, 1, 2] = 1


@pytest.mark.parametrize(
    "item, key, want",
    [
        ("model.kind=b", "kind", "b"),
        ("model.maybe=null", "maybe", None),
        ("model.maybe=y", "maybe", "y"),
        ("model.many=q,p", "many", ("q", "p")),
        ("model.level=2", "level", 2),  # parsed as the type the choices share
    ],
)
def test_a_recipes_model_choices_accept_their_values(item, key, want):
    exp = resolve(defaults(model=ChoiceModel()), sets=[item])
    assert getattr(exp.model, key) == want


@pytest.mark.parametrize(
    "item, match",
    [
        ("model.kind=c", r"model\.kind='c' is not one of a, b\b"),
        ("model.maybe=z", r"model\.maybe='z' is not one of x, y\b"),
        ("model.many=p,r", r"model\.many=\['p', 'r'\] has 'r', which is not one of p, q\b"),
        ("model.level=3", r"model\.level=3 is not one of 0, 1, 2\b"),
        ("model.level=one", r"'model\.level' got 'one'.*must be an integer"),
    ],
)
def test_a_recipes_model_choices_refuse_other_values(item, match):
    with pytest.raises(ConfigError, match=match):
        resolve(defaults(model=ChoiceModel()), sets=[item])


def test_a_bool_is_not_taken_for_an_integer_choice():
    with pytest.raises(ConfigError, match=r"model\.level=True is not one of 0, 1, 2\b"):
        resolve(defaults(model=ChoiceModel(level=True)))
