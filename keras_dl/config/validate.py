"""Validation: every setting's choices, its range, and the rules between settings.

Choices come from the schema's ``Literal`` types (:mod:`keras_dl.config.choices`), ranges from
the fields' metadata (:mod:`keras_dl.config.bounds`: the schema's counts from 1 and offsets from
0, a recipe's ``model`` ranges). The rest is written here: finite floats, the rules between fields
(``runtime.np`` needs Horovod, a Delta version or a timestamp, not both), the registry's metric
floor and aliases, and null only for the settings a recipe chooses itself. Each error names the
key and how to fix it. :func:`validate` also fills in the defaults derived from the recipe.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from keras_dl.config.bounds import check_bounds, chosen_by_recipe_keys
from keras_dl.config.choices import check_choices
from keras_dl.config.monitoring import check_prometheus
from keras_dl.config.schema import Experiment, RegistryConfig
from keras_dl.config.sources import check_sources
from keras_dl.errors import ConfigError


def validate(exp: Experiment) -> Experiment:
    """Check every setting's choices and ranges and the rules between settings, and fill in
    the recipe-derived defaults."""
    _check_finite(exp)  # a NaN passes every "<" and ">" test below
    check_choices(exp.sections())  # every Literal[...] field, from the schema's types
    check_bounds(exp.sections())  # every field with a range, e.g. train.epochs, model.dropout
    if exp.runtime.np != 0 and exp.runtime.strategy not in ("horovod", "multiworker"):
        raise ConfigError(
            f"runtime.np={exp.runtime.np} launches Horovod ranks or multi-worker processes, but "
            f"runtime.strategy={exp.runtime.strategy!r}. Add --set runtime.strategy=horovod (or "
            "multiworker), or drop runtime.np."
        )
    if exp.data.image_size and (len(exp.data.image_size) != 2 or min(exp.data.image_size) < 1):
        raise ConfigError(
            f"data.image_size={list(exp.data.image_size)} must be two positive integers "
            "(height, width), e.g. --set data.image_size=128,128."
        )
    for key, example in (("divergence_factor", 10), ("trivial_loss_factor", 100)):
        factor = getattr(exp.callbacks, key)
        if factor != 0 and not factor > 1:
            raise ConfigError(
                f"callbacks.{key}={factor:g} must be 0 (off) or greater than 1, e.g. --set "
                f"callbacks.{key}={example}."
            )
    seconds = exp.tracking.system_metrics_seconds
    if seconds != 0 and not seconds >= 0.1:
        raise ConfigError(
            f"tracking.system_metrics_seconds={seconds:g} must be 0 (off) or at least 0.1 "
            "(seconds between samples), e.g. --set tracking.system_metrics_seconds=10."
        )
    check_prometheus(exp.tracking)
    steps = exp.runtime.profile_steps
    if steps and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
        raise ConfigError(
            f"runtime.profile_steps={','.join(map(str, steps))} must be START,END with "
            "1 <= START <= END (training steps, from 1), e.g. --set runtime.profile_steps=10,15."
        )
    _check_registry(exp.registry)
    if exp.init_from and not MODEL_URI.match(exp.init_from):
        raise ConfigError(
            f"model.init_from={exp.init_from!r} is not a registered model: use "
            "models:/NAME@ALIAS or models:/NAME/VERSION, e.g. "
            "--set model.init_from=models:/digits@champion."
        )
    parse_class_weight(exp.train.class_weight)
    _check_labels(exp)
    if exp.data.version is not None and exp.data.timestamp:
        raise ConfigError("Set data.version or data.timestamp, not both.")
    if exp.data.since_version is not None and exp.data.since_timestamp:
        raise ConfigError("Set data.since_version or data.since_timestamp, not both.")
    if exp.data.since_version is not None and exp.data.since_version < 0:
        raise ConfigError(
            f"data.since_version={exp.data.since_version} is negative: it names the Delta version "
            "after which rows are read, e.g. --set data.since_version=0."
        )
    if exp.data.cache_dir_max_bytes is not None and not exp.data.cache_dir:
        raise ConfigError(
            f"data.cache_dir_max_bytes={exp.data.cache_dir_max_bytes} bounds the local copy of "
            "data.cache_dir, which is not set. Add --set data.cache_dir=/local/disk/folder, or "
            "drop data.cache_dir_max_bytes."
        )
    check_sources(exp.data)
    if not exp.data.table and not exp.data.sources:
        raise ConfigError(
            "data.table is empty. Point it at a Delta table or Parquet directory, for example "
            "--set data.table=data/digits (make one with `keras-dl ingest sklearn-digits`)."
        )
    name = exp.recipe or "keras-dl"
    tracking = dataclasses.replace(
        exp.tracking,
        uri=exp.tracking.uri or default_tracking_uri(),
        experiment=exp.tracking.experiment or name,
        registered_model=exp.tracking.registered_model or name,
    )
    runtime = dataclasses.replace(exp.runtime, run_dir=exp.runtime.run_dir or f"runs/{name}")
    return dataclasses.replace(exp, tracking=tracking, runtime=runtime)


def _check_labels(exp: Experiment) -> None:
    """``data.label``: one column or several distinct ones, none of them a feature."""
    data = exp.data
    labels = data.labels
    twice = sorted({c for c in labels if labels.count(c) > 1})
    if twice:
        raise ConfigError(
            f"data.label names {', '.join(map(repr, twice))} more than once "
            f"({', '.join(labels)}): each label is one output head. List each column once."
        )
    both = [c for c in labels if c in data.features]
    if both:
        raise ConfigError(
            f"data.label {', '.join(map(repr, both))} is also in data.features: a model would "
            "see its own answer. Drop it from data.features, or from data.label."
        )
    if data.weight_column is not None and data.weight_column in labels:
        raise ConfigError(
            f"data.weight_column={data.weight_column!r} is also in data.label: a weight column "
            "is never predicted. Name another column."
        )
    twice = sorted({c for c in data.lineage_columns if data.lineage_columns.count(c) > 1})
    if twice or any(not c.strip() for c in data.lineage_columns):
        raise ConfigError(
            f"data.lineage_columns={','.join(data.lineage_columns)!r} names a column twice or "
            "an empty one: list each column whose values the manifest keeps once."
        )
    if len(labels) > 1 and exp.train.class_weight:
        raise ConfigError(
            f"train.class_weight weighs the classes of one label, but data.label names "
            f"{len(labels)} ({', '.join(labels)}). Use data.weight_column to weigh rows of a "
            "several-label model, or train on one label."
        )


def default_tracking_uri() -> str:
    """A SQLite file ``mlflow.db`` in the working directory."""
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


# Settings a recipe may leave null in its defaults, to choose them from the table itself.
CHOSEN_BY_RECIPE = chosen_by_recipe_keys(Experiment().sections())


def check_chosen_by_recipe(defaults: Experiment, exp: Experiment) -> None:
    """Null is for a recipe that chooses the value (its default is null); elsewhere refuse it."""
    for key in CHOSEN_BY_RECIPE:
        section, name = key.split(".")
        default = getattr(getattr(defaults, section), name)
        if getattr(getattr(exp, section), name) is None and default is not None:
            raise ConfigError(
                f"Config key {key!r} got 'null', but it must be an integer: recipe "
                f"{exp.recipe or '(none)'!r} does not choose it from the table. Set a number, "
                f"for example --set {key}={default}."
            )


def _check_finite(exp: Experiment) -> None:
    """Every float setting, the recipe's model section included, must be a finite number."""
    for name, section in exp.sections().items():
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(
                    f"{name}.{f.name} must be a finite number, got {value}. Set a number, "
                    f"for example --set {name}.{f.name}=0.1."
                )


METRIC_OPS = (">=", "<=", ">", "<")  # two-character operators first: ">" prefixes ">="


def parse_class_weight(entries: tuple[str, ...]) -> str | dict[str, float] | None:
    """``train.class_weight`` as "balanced", ``{label text: weight}``, or None when unset.

    Raises:
        ConfigError: For an unknown mode or a pair that is not ``LABEL:WEIGHT`` with a finite
            weight >= 0, naming it.
    """
    if not entries:
        return None
    if len(entries) == 1 and entries[0].strip() == "balanced":
        return "balanced"
    weights = {}
    for entry in entries:
        key, sep, text = entry.rpartition(":")
        value = _number(text) if sep else None
        if not sep or not key.strip() or value is None or not 0 <= value < math.inf:
            raise ConfigError(
                f"train.class_weight entry {entry!r} is neither 'balanced' nor LABEL:WEIGHT with "
                "a finite weight >= 0. Use --set train.class_weight=balanced or "
                "--set train.class_weight=0:1,1:5."
            )
        weights[key.strip()] = value
    return weights


def parse_min_metric(text: str) -> tuple[str, str, float]:
    """``"test_accuracy >= 0.95"`` as ``("test_accuracy", ">=", 0.95)``.

    Raises:
        ConfigError: When ``text`` is not "NAME OP NUMBER" with OP one of >=, >, <=, <.
    """
    for op in METRIC_OPS:
        name, found, number = text.partition(op)
        if not found:
            continue
        value = _number(number.strip())
        if name.strip() and value is not None and math.isfinite(value):
            return name.strip(), op, value
        break
    raise ConfigError(
        f"registry.min_metric={text!r} is not NAME OP NUMBER with OP one of "
        f"{', '.join(METRIC_OPS)}, e.g. --set registry.min_metric=test_accuracy>=0.95."
    )


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# A registered model version: models:/NAME/VERSION or models:/NAME@ALIAS.
MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")


def valid_alias(alias: str) -> bool:
    """Whether MLflow accepts ``alias`` for a registered model ("latest" is its own)."""
    return bool(re.fullmatch(r"[A-Za-z][\w-]*", alias)) and alias.lower() != "latest"


def _check_registry(registry: RegistryConfig) -> None:
    if registry.min_metric:
        parse_min_metric(registry.min_metric)
    for key in ("must_beat", "set_alias"):
        alias = getattr(registry, key)
        if alias and not valid_alias(alias):
            raise ConfigError(
                f"registry.{key}={alias!r} is not a valid alias: use letters, digits, '_' or "
                "'-', starting with a letter ('latest' is reserved by MLflow), e.g. champion."
            )
