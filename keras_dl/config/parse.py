"""From text to typed settings: config YAML files, ``--set section.key=value`` overrides, and
mappings of them applied to an :class:`~keras_dl.config.schema.Experiment`.

Every value is parsed by its field's type (:func:`_coerce`): a str stays as written, a bool takes
true/false, a tuple a comma list and an Optional null. Unknown sections and keys, and values
that do not parse, raise :class:`~keras_dl.errors.ConfigError` naming the key, where the value
came from and the valid keys.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from keras_dl.config.schema import SHARED_MODEL_KEYS, Experiment
from keras_dl.errors import ConfigError


def read_yaml(path: str | os.PathLike) -> dict:
    """Read a config YAML file into a ``{section: {key: value}}`` mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file {str(p)!r} does not exist. Pass an existing YAML file.")
    try:
        # BaseLoader keeps every scalar as its text, for _coerce to parse by the field's type.
        loaded = yaml.load(p.read_text(), Loader=yaml.BaseLoader) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"Config file {str(p)!r} must hold a mapping of sections.")
    loaded.pop("recipe", None)
    return loaded


def parse_set(item: str) -> dict:
    """Turn ``"train.epochs=3"`` into ``{"train": {"epochs": "3"}}`` (parsed later by type)."""
    key, sep, raw = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(
            f"--set {item!r} is not of the form section.key=value (for example "
            f"--set train.epochs=5). Valid keys: {', '.join(valid_keys(Experiment(model=None)))}."
        )
    # The text as written: _coerce parses it by the field's type (YAML's guess would turn
    # 2026-11-24T06:32:54+00:00 into a datetime and 0042 into 42).
    return {section: {name: raw.strip()}}


def apply_mapping(exp: Experiment, mapping: Mapping, origin: str = "config") -> Experiment:
    """Return ``exp`` with the values of ``{section: {key: value}}`` applied (type-checked)."""
    sections = exp.sections()
    changes = {}
    for section, values in mapping.items():
        if section == "model" and isinstance(values, Mapping):
            # model.init_from and the other keys every recipe shares live on Experiment.
            shared = {k: v for k, v in values.items() if k in SHARED_MODEL_KEYS}
            for key, value in shared.items():
                changes[key] = _coerce(value, str, f"model.{key}", origin)
            values = {k: v for k, v in values.items() if k not in SHARED_MODEL_KEYS}
            if not values:
                continue
        if section not in sections:
            raise ConfigError(
                f"Unknown config section {section!r} in {origin}.{_did_you_mean(section, sections)}"
                " Valid sections: "
                f"{', '.join(sections)}. Valid keys: {', '.join(valid_keys(exp))}."
            )
        if not isinstance(values, Mapping):
            raise ConfigError(f"Section {section!r} in {origin} must be a mapping of key: value.")
        current = changes.get(section, sections[section])
        hints = typing.get_type_hints(type(current))
        if section == "model":
            hints.update(dict.fromkeys(SHARED_MODEL_KEYS, str))  # listed among its valid keys
        updates = {}
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    # The section's keys only: every key of every section no longer reads
                    # as one short paragraph.
                    f"Unknown config key '{section}.{key}' in {origin}."
                    f"{_did_you_mean(f'{section}.{key}', valid_keys(exp), key)} Valid keys in "
                    f"{section!r}: {', '.join(f'{section}.{h}' for h in hints)}. Other sections: "
                    f"{', '.join(s for s in sections if s != section)}."
                )
            updates[key] = _coerce(value, hints[key], f"{section}.{key}", origin)
        changes[section] = dataclasses.replace(current, **updates)
    return dataclasses.replace(exp, **changes)


def valid_keys(exp: Experiment) -> list[str]:
    """Every ``section.key`` that ``--set`` accepts for this experiment."""
    return [
        f"{name}.{f.name}"
        for name, section in exp.sections().items()
        for f in dataclasses.fields(section)
    ] + [f"model.{key}" for key in SHARED_MODEL_KEYS]


def _coerce(value: Any, hint: Any, key: str, origin: str) -> Any:
    """``value`` as the field's type. Text (every ``--set`` value, every YAML scalar) is parsed
    by the type: a str stays as written, a bool takes true/false, a tuple a comma list and an
    Optional null. Values that are already typed (from Python) are checked and kept."""
    origin_type = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin_type in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULLS):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        tuples = [a for a in inner if typing.get_origin(a) is tuple]
        if tuples and len(inner) > 1 and _is_list(value):  # data.label=a,b: several labels
            return _coerce(value, tuples[0], key, origin)
        return _coerce(value, inner[0], key, origin)
    if origin_type is typing.Literal:
        # Parsed as the type its values share (str for every choice today). Whether it is one
        # of them is checked on the resolved experiment (keras_dl.config.choices).
        kinds = {type(a) for a in args}
        return _coerce(value, kinds.pop(), key, origin) if len(kinds) == 1 else value
    if origin_type is tuple and dataclasses.is_dataclass(args[0]):
        return _coerce_records(value, args[0], key, origin)
    if origin_type is tuple:
        if isinstance(value, Mapping):  # train.class_weight: {0: 1.0, 1: 5.0} in YAML
            value = [f"{k}:{v}" for k, v in value.items()]
        if isinstance(value, str):
            text = value.strip()
            if text[:1] + text[-1:] in ("[]", "()"):  # --set data.features=[a, b]
                text = text[1:-1]
            value = [v.strip() for v in text.split(",") if v.strip()]
        if value is None:
            value = []
        if not isinstance(value, (list, tuple)):
            raise _type_error(key, value, "a comma-separated list", origin)
        return tuple(_coerce(v, args[0], key, origin) for v in value)
    if isinstance(value, str) and hint in _PARSERS:
        parsed = _PARSERS[hint](value.strip())
        if parsed is None:
            raise _type_error(key, value, _EXPECTED[hint], origin)
        return parsed
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(key, value, "true or false", origin)
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _type_error(key, value, "an integer", origin)
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _type_error(key, value, "a number", origin)
    if hint is str:
        if isinstance(value, (datetime.date, datetime.time)):
            return value.isoformat()  # from a mapping someone loaded with YAML's own types
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(key, value, "a string", origin)
    return value


_NULLS = ("null", "none", "~", "")


def _coerce_records(value: Any, kind: type, key: str, origin: str) -> tuple:
    """A list of records (``data.sources``): from YAML a list of mappings (or a mapping of
    name to record), from ``--set`` the same in YAML's flow style, each field by its type."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value) if value.strip() else []
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"Config key {key!r} from {origin} is not a YAML list: {exc}. Write it as, "
                f"e.g., --set '{key}=[{{name: old, table: t1, weight: 0.7}}, {{name: new, "
                "table: t2, weight: 0.3}]'."
            ) from exc
    if value is None:
        return ()
    if isinstance(value, Mapping):  # {old: {table: t1, weight: 0.7}, ...}
        value = [
            {"name": name, **(dict(v) if isinstance(v, Mapping) else {})}
            for name, v in value.items()
        ]
    if not isinstance(value, (list, tuple)):
        raise _type_error(key, value, "a list of mappings", origin)
    hints = typing.get_type_hints(kind)
    out = []
    for i, item in enumerate(value):
        if isinstance(item, kind):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise _type_error(f"{key}[{i}]", item, "a mapping of key: value", origin)
        unknown = [k for k in item if k not in hints]
        if unknown:
            raise ConfigError(
                f"Unknown key {unknown[0]!r} in {key}[{i}] from {origin}. Valid keys of a "
                f"{key} entry: {', '.join(hints)}."
            )
        fields = {k: _coerce(v, hints[k], f"{key}[{i}].{k}", origin) for k, v in item.items()}
        out.append(kind(**fields))
    return tuple(out)


def _is_list(value: Any) -> bool:
    """A list from Python or YAML, or a text written as one (``a,b`` or ``[a]``)."""
    if isinstance(value, (list, tuple)):
        return True
    text = value.strip() if isinstance(value, str) else ""
    return "," in text or text[:1] + text[-1:] in ("[]", "()")


def _did_you_mean(wrong: str, choices: Iterable[str], name: str | None = None) -> str:
    """`` Did you mean X?`` for the closest valid name, or "" when none is close. ``name`` (the
    key alone) also matches a key of the same name in another section."""
    choices = list(choices)
    close = difflib.get_close_matches(wrong, choices, n=1, cutoff=0.75)
    if not close and name is not None:
        close = [c for c in choices if c.split(".", 1)[-1] == name][:1]
    return f" Did you mean {close[0]}?" if close else ""


def _parse_bool(text: str) -> bool | None:
    return {"true": True, "false": False}.get(text.lower())


def _parse_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        number = _parse_float(text)  # "1e3" is an integer too; "1.5" is not
        return int(number) if number is not None and number.is_integer() else None


def _parse_float(text: str) -> float | None:
    try:
        return float(text)  # NaN and inf parse here and are refused by validate()
    except ValueError:
        return None


_PARSERS = {str: lambda text: text, bool: _parse_bool, int: _parse_int, float: _parse_float}
_EXPECTED = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}


def _type_error(key: str, value: Any, expected: str, origin: str) -> ConfigError:
    return ConfigError(
        f"Config key {key!r} got {value!r} ({type(value).__name__}) from {origin}, but it must be "
        f"{expected}. Fix the value, for example --set {key}=<{expected}>."
    )
