"""From typed settings back to text: flat and nested dicts, YAML, and the saved ``config.yaml``.

A saved file is itself a valid ``--config`` file: :func:`keras_dl.config.resolve` reads it back
to the same experiment.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from keras_dl.config.schema import Experiment


def to_flat_dict(exp: Experiment) -> dict[str, Any]:
    """``{"section.key": value}`` for every resolved value, plus ``recipe``."""
    flat: dict[str, Any] = {"recipe": exp.recipe}
    for name, section in exp.sections().items():
        for f in dataclasses.fields(section):
            flat[f"{name}.{f.name}"] = getattr(section, f.name)
    return flat


def to_dict(exp: Experiment) -> dict[str, Any]:
    """``{"recipe": ..., section: {key: value}}`` with tuples as lists, ready for YAML."""
    out: dict[str, Any] = {"recipe": exp.recipe}
    for name, section in exp.sections().items():
        out[name] = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(section).items()
        }
    return out


def save(exp: Experiment, path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML to a local ``path`` (atomically) and return the path.

    A rename over the target, not fsynced. Durable writes, local or to an object store, are
    :func:`keras_dl.storage.write_atomic`'s job, and storage sits above config in the layers
    (.importlinter), so config cannot call it: a caller in a layer above storage writes
    ``dumps(exp).encode()`` with it instead (as ``callbacks.defaults.record_config`` does for
    a remote run folder).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(dumps(exp))
    os.replace(tmp, p)
    return p


def dumps(exp: Experiment) -> str:
    """The resolved config as YAML text (what :func:`save` writes)."""
    return yaml.safe_dump(to_dict(exp), sort_keys=False)
