"""From typed settings back to text: flat and nested dicts, YAML, and the saved ``config.yaml``.

A saved file is itself a valid ``--config`` file: :func:`keras_dl.config.resolve` reads it back
to the same experiment.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from keras_dl.config.schema import SHARED_MODEL_KEYS, Experiment


def to_flat_dict(exp: Experiment) -> dict[str, Any]:
    """``{"section.key": value}`` for every resolved value, plus ``recipe``."""
    flat: dict[str, Any] = {"recipe": exp.recipe}
    for name, section in exp.sections().items():
        for f in dataclasses.fields(section):
            flat[f"{name}.{f.name}"] = getattr(section, f.name)
    for key in SHARED_MODEL_KEYS:
        flat[f"model.{key}"] = getattr(exp, key)
    return flat


def to_dict(exp: Experiment) -> dict[str, Any]:
    """``{"recipe": ..., section: {key: value}}`` with tuples as lists, ready for YAML."""
    out: dict[str, Any] = {"recipe": exp.recipe}
    for name, section in exp.sections().items():
        out[name] = {k: _plain(v) for k, v in dataclasses.asdict(section).items()}
    model = out.setdefault("model", {})
    model.update({key: getattr(exp, key) for key in SHARED_MODEL_KEYS})
    return out


def _plain(value: Any) -> Any:
    """Tuples as lists, inside records too (``data.sources``), for YAML's safe dumper."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def dumps(exp: Experiment) -> str:
    """The resolved config as YAML text: a valid ``--config`` file (the run folder's
    ``config.yaml``, written by :class:`keras_dl.run.RunFolder` through a Store)."""
    return yaml.safe_dump(to_dict(exp), sort_keys=False)
