"""Choices checked from the types: a field typed ``Literal[...]`` takes only the values it lists.

The schema's types are the one list of each setting's choices. :func:`check_choices` walks every
section of an experiment, the recipe's ``model`` section included, with
:func:`typing.get_type_hints`, and refuses a value outside its field's ``Literal`` (also inside
``X | None`` and ``tuple[X, ...]``) with an error naming the key, the value and the values
allowed. No setting keeps a hand-written list of its own.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from keras_dl.errors import ConfigError


def choices_of(hint: Any) -> tuple | None:
    """The values a ``Literal[...]`` hint allows, unwrapping ``X | None`` and ``tuple[X, ...]``;
    None when the hint is not a choice (a union that mixes a Literal with other types isn't)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return typing.get_args(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        return choices_of(args[0]) if len(args) == 2 and args[1] is Ellipsis else None
    if origin in (typing.Union, types.UnionType):
        inner = [choices_of(a) for a in typing.get_args(hint) if a is not type(None)]
        if inner and all(c is not None for c in inner):
            return tuple(dict.fromkeys(v for c in inner for v in c))
    return None


def check_choices(sections: dict[str, Any]) -> None:
    """Refuse a value outside its field's ``Literal``, in every ``{name: section}`` given.

    Raises:
        ConfigError: Naming ``section.key``, the value and the values allowed.
    """
    for name, section in sections.items():
        hints = typing.get_type_hints(type(section))
        for f in dataclasses.fields(section):
            allowed = choices_of(hints[f.name])
            if allowed is None:
                continue
            value = getattr(section, f.name)
            for item in _items(value, hints[f.name]):
                if not _is_one_of(item, allowed):
                    raise _choice_error(f"{name}.{f.name}", value, item, allowed)


def _items(value: Any, hint: Any) -> list:
    """The values to check: a tuple field's elements, nothing for None in an Optional field."""
    if value is None and _allows_none(hint):
        return []
    if isinstance(value, tuple) and _is_tuple(hint):
        return list(value)
    return [value]


def _allows_none(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _is_tuple(hint: Any) -> bool:
    if typing.get_origin(hint) is tuple:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_tuple(a) for a in typing.get_args(hint))
    return False


def _is_one_of(value: Any, allowed: tuple) -> bool:
    """``value in allowed`` of the same type: True is not 1, and 1.0 is not 1."""
    return any(type(value) is type(a) and value == a for a in allowed)


def _choice_error(key: str, value: Any, item: Any, allowed: tuple) -> ConfigError:
    listed = ", ".join(str(a) for a in allowed)
    where = f"{key}={value!r}" if item is value else f"{key}={list(value)!r} has {item!r}, which"
    return ConfigError(
        f"{where} is not one of {listed}. Set one of them, for example --set {key}={allowed[0]}."
    )
