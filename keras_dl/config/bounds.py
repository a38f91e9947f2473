"""Facts declared on the fields: ``dropout: float = bounded(0.3, 0, 1, high_open=True)``.

A setting's range, and whether a resumed training may change it, are written where the field
is, as field metadata, not in lists of keys elsewhere. A recipe's ``model`` section is a plain
dataclass the recipe owns, so its ranges are declared the same way (:func:`bounded`); the
schema's own sections use :func:`setting`, which also says ``free_on_resume``.

- :func:`check_bounds` checks every section of an experiment when it is resolved, before any
  data is read or any run starts. A value out of range is refused with an error naming the key,
  the value and the range allowed, rather than failing inside Keras after the MLflow run was
  created.
- :func:`free_on_resume_keys` names the settings a resumed training may change (how the data is
  read, how long to train), which ``keras_dl.run.resume``'s config fingerprint leaves out.
- :func:`chosen_by_recipe_keys` names the settings a recipe may leave null in its defaults, to
  choose them from the table itself (``train.epochs``, ``train.batch_size``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from keras_dl.errors import ConfigError

BOUNDS = "keras_dl.bounds"  # the field-metadata keys
FREE_ON_RESUME = "keras_dl.free_on_resume"
CHOSEN_BY_RECIPE = "keras_dl.chosen_by_recipe"
EXAMPLE = "keras_dl.example"  # the value an out-of-range error suggests, when not the default


@dataclass(frozen=True)
class Bounds:
    """The numbers a setting allows: from ``low`` to ``high`` (None: no bound on that side),
    each end included unless it is open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def allows(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return (
            f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.high_open else ']'}"
        )


def bounded(
    default: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """A dataclass field with ``default`` whose value (or, for a tuple, each item) must lie
    between ``low`` and ``high``; the ends are included unless ``low_open`` / ``high_open``.

    Example:
        >>> @dataclass(frozen=True)
        ... class Model:
        ...     dropout: float = bounded(0.3, 0, 1, high_open=True)  # [0, 1)
        ...     units: tuple[int, ...] = bounded((64, 32), 1)  # each >= 1
    """
    return setting(default, low, high, low_open=low_open, high_open=high_open)


def setting(
    default: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    free_on_resume: bool = False,
    chosen_by_recipe: bool = False,
    example: Any = None,
) -> Any:
    """A dataclass field with ``default``, the range :func:`bounded` takes (none when ``low``
    and ``high`` are both None), whether a resumed training may change it, whether a recipe
    may leave it null to choose it from the table, and the ``example`` in its range an error
    suggests (defaults to None: the default, which a setting that is off by default lacks)."""
    metadata: dict[str, Any] = {}
    if example is not None:
        metadata[EXAMPLE] = example
    if low is not None or high is not None:
        metadata[BOUNDS] = Bounds(low, high, low_open, high_open)
    if free_on_resume:
        metadata[FREE_ON_RESUME] = True
    if chosen_by_recipe:
        metadata[CHOSEN_BY_RECIPE] = True
    return dataclasses.field(default=default, metadata=metadata)


def _keys(sections: dict[str, Any], fact: str) -> tuple[str, ...]:
    """``section.key`` of every field declaring ``fact``, in field order."""
    return tuple(
        f"{name}.{f.name}"
        for name, section in sections.items()
        for f in dataclasses.fields(section)
        if f.metadata.get(fact)
    )


def free_on_resume_keys(sections: dict[str, Any]) -> set[str]:
    """``section.key`` of every field declared ``free_on_resume``, in ``{name: section}``."""
    return set(_keys(sections, FREE_ON_RESUME))


def chosen_by_recipe_keys(sections: dict[str, Any]) -> tuple[str, ...]:
    """``section.key`` of every field declared ``chosen_by_recipe``, in ``{name: section}``."""
    return _keys(sections, CHOSEN_BY_RECIPE)


def check_bounds(sections: dict[str, Any]) -> None:
    """Refuse a value outside its field's :func:`bounded` range, in every ``{name: section}``.

    Raises:
        ConfigError: Naming ``section.key``, the value, the range and an example in it.
    """
    for name, section in sections.items():
        for f in dataclasses.fields(section):
            bounds = f.metadata.get(BOUNDS)
            value = getattr(section, f.name)
            if bounds is None or value is None:
                continue
            items = value if isinstance(value, tuple) else (value,)
            for item in items:
                if not _is_number(item) or not bounds.allows(item):
                    example = f.metadata.get(EXAMPLE, f.default)
                    raise _bounds_error(f"{name}.{f.name}", value, item, bounds, example)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not (isinstance(value, float) and math.isnan(value))
    )


def _bounds_error(key: str, value: Any, item: Any, bounds: Bounds, example: Any) -> ConfigError:
    def text(v):
        return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)

    where = f"{key}={text(value)}"
    if item is not value:
        where += f" has {item!r}, which"
    example = "..." if example is None else text(example)
    return ConfigError(
        f"{where} is outside the allowed range {bounds}"
        f"{' (each value)' if isinstance(value, tuple) else ''}. Set a value in it, for example "
        f"--set {key}={example}."
    )
