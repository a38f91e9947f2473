"""A search space in the recipe's config language, parsed without ``eval``.

Each dimension is ``section.key=KIND(ARGS)``, as ``--space`` takes it::

    train.learning_rate=loguniform(1e-4,1e-1)
    train.batch_size=int(16,64)
    model.dropout=uniform(0,0.5)
    model.hidden=choice([64,32],[128,64])
    train.optimizer=choice(adam,sgd)

or a YAML file of the same, flat (``train.learning_rate: loguniform(1e-4,1e-1)``) or by section
(``train: {learning_rate: ...}``). The arguments are split by a small parser (brackets and
quotes nest; nothing runs as code). Each choice stays the text it was written as, and is parsed
by its field's type as ``--set`` parses it. :func:`check_space` applies every bound and choice
to the recipe's experiment before any trial starts, so unknown keys and values the field does
not take are :class:`~keras_dl.errors.ConfigError` up front.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from keras_dl.config import apply_mapping, validate
from keras_dl.config.schema import Experiment
from keras_dl.errors import ConfigError

KINDS = ("uniform", "loguniform", "int", "logint", "choice")


@dataclass(frozen=True)
class Dimension:
    """One searched setting: ``key`` (``section.name``), ``kind`` and its arguments (numbers
    for ranges, the choices' text for ``choice``)."""

    key: str
    kind: str
    args: tuple

    def suggest(self, trial) -> str:
        """This dimension's value for an Optuna ``trial``, as text ``--set`` would take."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.args))
        low, high = self.args
        if self.kind in ("int", "logint"):
            return str(trial.suggest_int(self.key, int(low), int(high), log=self.kind == "logint"))
        return repr(trial.suggest_float(self.key, low, high, log=self.kind == "loguniform"))

    def __str__(self) -> str:
        return f"{self.key}={self.kind}({','.join(str(a) for a in self.args)})"


def parse_space(items: Iterable[str]) -> list[Dimension]:
    """Parse ``--space section.key=KIND(ARGS)`` strings (or lines of a YAML file)."""
    dims = [parse_dimension(item) for item in items]
    keys = [d.key for d in dims]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"--space names {', '.join(twice)} more than once. Keep one of each.")
    return dims


def parse_dimension(item: str, origin: str = "--space") -> Dimension:
    """``"train.learning_rate=loguniform(1e-4,1e-1)"`` as a :class:`Dimension`."""
    key, sep, spec = item.partition("=")
    key, spec = key.strip(), spec.strip()
    section, dot, name = key.partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(
            f"{origin} {item!r} is not of the form section.key=KIND(ARGS), for example "
            "--space train.learning_rate=loguniform(1e-4,1e-1). KIND is one of "
            f"{', '.join(KINDS)}."
        )
    kind, paren, rest = spec.partition("(")
    kind = kind.strip()
    if kind not in KINDS or not paren or not rest.endswith(")"):
        raise ConfigError(
            f"{origin} {item!r}: {spec!r} is not KIND(ARGS) with KIND one of {', '.join(KINDS)}; "
            f"for example {key}=uniform(0.1,0.5) or {key}=choice(a,b)."
        )
    args = split_args(rest[:-1], f"{origin} {item!r}")
    if kind == "choice":
        if not args:
            raise ConfigError(f"{origin} {item!r}: choice() needs at least one value.")
        return Dimension(key, kind, tuple(_unquote(a) for a in args))
    return Dimension(key, kind, _range(kind, args, f"{origin} {item!r}"))


def read_space(path: str | os.PathLike) -> list[Dimension]:
    """Read a YAML space file: ``{section.key: KIND(ARGS)}`` or ``{section: {key: KIND(ARGS)}}``."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Space file {str(p)!r} does not exist. Pass an existing YAML file.")
    try:
        loaded = yaml.load(p.read_text(), Loader=yaml.BaseLoader) or {}  # every scalar as text
    except yaml.YAMLError as exc:
        raise ConfigError(f"Space file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"Space file {str(p)!r} must hold a mapping of section.key: KIND(ARGS).")
    items = []
    for key, value in loaded.items():
        if isinstance(value, Mapping):
            items += [f"{key}.{name}={spec}" for name, spec in value.items()]
        elif isinstance(value, str):
            items.append(f"{key}={value}")
        else:
            raise ConfigError(
                f"Space file {str(p)!r}: {key} must be KIND(ARGS) text, e.g. {key}: uniform(0,1)."
            )
    return parse_space(items)


def check_space(exp: Experiment, space: list[Dimension]) -> None:
    """Apply each dimension's bounds and choices to ``exp`` and validate: an unknown key or a
    value its field does not take is a :class:`ConfigError` before any trial runs."""
    if not space:
        raise ConfigError(
            "The search space is empty. Add --space section.key=KIND(ARGS), e.g. "
            "--space train.learning_rate=loguniform(1e-4,1e-1), or --space-file space.yaml."
        )
    for dim in space:
        values = dim.args if dim.kind == "choice" else (_text(dim, a) for a in dim.args)
        for value in values:
            apply_values(exp, {dim.key: value}, origin=f"--space {dim}")


def apply_values(exp: Experiment, values: Mapping[str, str], origin: str) -> Experiment:
    """``exp`` with ``{section.key: text}`` applied (parsed by field type) and validated."""
    mapping: dict[str, dict[str, str]] = {}
    for key, value in values.items():
        section, _, name = key.partition(".")
        mapping.setdefault(section, {})[name] = value
    exp = apply_mapping(exp, mapping, origin=origin)  # its errors name the origin already
    try:
        return validate(exp)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (from {origin})") from None


def split_args(text: str, origin: str) -> list[str]:
    """Split ``text`` at the commas outside brackets and quotes: ``[64,32],[128,64]`` is two."""
    parts, quote, start = [], "", 0
    closing = {"]": "[", ")": "(", "}": "{"}
    stack: list[str] = []
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[({":
            stack.append(ch)
        elif ch in closing:
            if not stack or stack.pop() != closing[ch]:
                raise ConfigError(f"{origin}: unbalanced {ch!r} at character {i + 1} of {text!r}.")
        elif ch == "," and not stack:
            parts.append(text[start:i].strip())
            start = i + 1
    if quote or stack:
        raise ConfigError(f"{origin}: unclosed {quote or stack[-1]!r} in {text!r}.")
    last = text[start:].strip()
    if last or parts:
        parts.append(last)
    if any(not p for p in parts):
        raise ConfigError(f"{origin}: an empty value in {text!r}.")
    return parts


def _range(kind: str, args: list[str], origin: str) -> tuple:
    if len(args) != 2:
        raise ConfigError(f"{origin}: {kind}() takes two bounds, low and high, e.g. {kind}(1,10).")
    number = int if kind in ("int", "logint") else float
    try:
        low, high = (number(_float_text(a, number)) for a in args)
    except ValueError:
        what = "integers" if number is int else "numbers"
        raise ConfigError(f"{origin}: the bounds of {kind}() must be {what}, got {args}.") from None
    if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
        raise ConfigError(f"{origin}: {kind}() needs finite bounds with low < high.")
    if kind.startswith("log") and low <= 0:
        raise ConfigError(f"{origin}: {kind}() needs low > 0 (a log scale), got {low}.")
    return low, high


def _float_text(text: str, number) -> str:
    """``1e3`` is an integer bound too; ``1.5`` is not."""
    if number is int and not text.lstrip("+-").isdigit():
        value = float(text)
        if not value.is_integer():
            raise ValueError(text)
        return str(int(value))
    return text


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'" else text


def _text(dim: Dimension, value) -> str:
    return str(value) if dim.kind in ("int", "logint") else repr(float(value))
