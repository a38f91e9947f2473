"""Experiment configuration: plain frozen dataclasses, YAML files and ``--set`` overrides.

Overrides are applied in a fixed order: the recipe's defaults, then ``--config file.yaml``, then
each ``--set section.key=value`` in the order given. Unknown keys and badly typed values raise
:class:`~keras_dl.errors.ConfigError` before any work starts, with the list of valid keys.

The package's modules, each with one job (lowest first):

- :mod:`~keras_dl.config.schema`: the sections as dataclasses, their defaults and documentation;
- :mod:`~keras_dl.config.parse`: YAML files, ``--set`` overrides and mappings into those types;
- :mod:`~keras_dl.config.dump`: the resolved config as dicts and YAML, and saving it;
- :mod:`~keras_dl.config.choices` and :mod:`~keras_dl.config.bounds`: the values a field's
  ``Literal`` type or its declared range (:func:`bounded`, e.g. a recipe's ``model.dropout``)
  allows;
- :mod:`~keras_dl.config.validate`: ranges and the rules between fields;
- :mod:`~keras_dl.config.overrides`: :func:`resolve`, which applies them in order.
- :mod:`~keras_dl.config.keytable`: docs/configuration.md's key tables, derived from the
  schema's fields.

Example:
    >>> from keras_dl.config import Experiment, DataConfig, resolve
    >>> exp = resolve(Experiment(recipe="digits", data=DataConfig(table="/tmp/t")),
    ...               sets=["train.epochs=3"])
    >>> exp.train.epochs
    3
"""

from keras_dl.config.bounds import (
    Bounds,
    bounded,
    chosen_by_recipe_keys,
    free_on_resume_keys,
    setting,
)
from keras_dl.config.dump import dumps, to_dict, to_flat_dict
from keras_dl.config.overrides import resolve
from keras_dl.config.parse import apply_mapping, parse_set, read_yaml, valid_keys
from keras_dl.config.schema import (
    SHARED_MODEL_KEYS,
    STRATEGIES,
    CallbacksConfig,
    DataConfig,
    Experiment,
    RegistryConfig,
    RuntimeConfig,
    SourceConfig,
    TrackingConfig,
    TrainConfig,
    TuneConfig,
)
from keras_dl.config.validate import (
    CHOSEN_BY_RECIPE,
    METRIC_OPS,
    MODEL_URI,
    default_tracking_uri,
    parse_min_metric,
    valid_alias,
    validate,
)

__all__ = [
    "CHOSEN_BY_RECIPE",
    "METRIC_OPS",
    "MODEL_URI",
    "SHARED_MODEL_KEYS",
    "STRATEGIES",
    "Bounds",
    "CallbacksConfig",
    "DataConfig",
    "SourceConfig",
    "Experiment",
    "RegistryConfig",
    "RuntimeConfig",
    "TrackingConfig",
    "TrainConfig",
    "TuneConfig",
    "apply_mapping",
    "bounded",
    "chosen_by_recipe_keys",
    "free_on_resume_keys",
    "default_tracking_uri",
    "dumps",
    "parse_min_metric",
    "parse_set",
    "read_yaml",
    "resolve",
    "setting",
    "to_dict",
    "to_flat_dict",
    "valid_alias",
    "valid_keys",
    "validate",
]
