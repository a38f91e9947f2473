"""Resolving an experiment: the recipe's defaults, then a YAML file, then ``--set``, validated.

Overrides are applied in a fixed order: the recipe's defaults, then ``--config file.yaml``, then
each ``--set section.key=value`` in the order given. Unknown keys and badly typed values raise
:class:`~keras_dl.errors.ConfigError` before any work starts, with the list of valid keys.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from keras_dl.config.parse import apply_mapping, parse_set, read_yaml
from keras_dl.config.schema import Experiment
from keras_dl.config.validate import check_chosen_by_recipe, validate


def resolve(
    defaults: Experiment, config_file: str | os.PathLike | None = None, sets: Iterable[str] = ()
) -> Experiment:
    """Apply a YAML file, then ``--set`` overrides, to a recipe's defaults, and validate.

    Args:
        defaults: The recipe's default experiment.
        config_file: YAML file of ``{section: {key: value}}``. Defaults to None.
        sets: ``section.key=value`` strings; each value is parsed by its field's type (a str
            stays as written, a bool takes true/false, a tuple a comma list, an Optional
            null). Defaults to ().

    Returns:
        The resolved, validated experiment.

    Raises:
        ConfigError: On an unknown key, a badly typed value or an invalid setting.
    """
    exp = defaults
    if config_file:
        exp = apply_mapping(exp, read_yaml(config_file), origin=str(config_file))
    for item in sets:
        exp = apply_mapping(exp, parse_set(item), origin=f"--set {item}")
    exp = validate(exp)
    check_chosen_by_recipe(defaults, exp)
    return exp
