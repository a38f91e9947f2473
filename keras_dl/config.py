"""Experiment configuration: plain frozen dataclasses, YAML files and ``--set`` overrides.

Overrides are applied in a fixed order: the recipe's defaults, then ``--config file.yaml``, then each
``--set section.key=value`` in the order given. Unknown keys and badly typed values raise
:class:`~keras_dl.errors.ConfigError` before any work starts, with the list of valid keys.

Example:
    >>> from keras_dl.config import Experiment, DataConfig, resolve
    >>> exp = resolve(Experiment(recipe="digits", data=DataConfig(table="/tmp/t")),
    ...               sets=["train.epochs=3"])
    >>> exp.train.epochs
    3
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from keras_dl.errors import ConfigError

STRATEGIES = ("auto", "none", "mirrored", "horovod")


@dataclass(frozen=True)
class DataConfig:
    """Where the training data lives and how it is read.

    Args:
        table: Delta table or Parquet directory, glob or comma-separated file list.
        version: Delta version to read (time travel). Defaults to the latest.
        timestamp: Delta timestamp (ISO 8601) to read instead of a version. Defaults to None.
        label: Label column. Defaults to "label".
        features: Feature columns; empty means every column but the label and split column.
        split_column: Column that holds "train"/"validation"/"test". Defaults to None (no splits).
        train_split: Value of ``split_column`` for training rows. Defaults to "train".
        validation_table: Separate validation table. Defaults to None (use ``validation_split``).
        validation_split: Value of ``split_column`` for validation rows; empty for none.
        test_table: Separate test table. Defaults to None (use ``test_split``).
        test_split: Value of ``split_column`` for test rows; empty for none.
        workers: Petastorm reader worker threads. Defaults to 2.
        shuffle: Shuffle row groups and rows (seeded). Defaults to True.
        shuffle_buffer: Rows mixed in memory when shuffling. Defaults to 4096.
        seed: Seed for row-group order and the shuffle buffer. Defaults to 42.
        deterministic: Reproducible row order run after run: the seeded shuffle with one reader
            thread (slower). Defaults to False.
        filters: Row filters "COLUMN OP VALUE" (OP one of = != < <= > >= in, "in" values
            separated by "|"), e.g. ("year >= 2020", "country in US|FR"). Filters on partition
            columns skip whole files. Defaults to ().
        cache_dir: Copy the table's files to this local folder once and read them from there
            (for remote or slow storage). Defaults to None (read in place).
        image_size: (height, width) for image recipes; empty keeps the recipe's. Defaults to ().
        on_bad_image: "fail" on an undecodable image, or "skip" it and count it (logged to
            MLflow as data.bad_images_skipped). Defaults to "fail".
        trust_petastorm_metadata: Load a Petastorm dataset's Unischema with Petastorm's own
            unpickler, which runs whatever code the pickle in ``_common_metadata`` names. Only
            for tables whose writer you trust. Defaults to False: only Petastorm's, numpy's and
            Spark's data classes are unpickled, anything else is refused with an error.
    """

    table: str = ""
    version: int | None = None
    timestamp: str | None = None
    label: str = "label"
    features: tuple[str, ...] = ()
    split_column: str | None = None
    train_split: str = "train"
    validation_table: str | None = None
    validation_split: str = "validation"
    test_table: str | None = None
    test_split: str = "test"
    workers: int = 2
    shuffle: bool = True
    shuffle_buffer: int = 4096
    seed: int = 42
    deterministic: bool = False
    filters: tuple[str, ...] = ()
    cache_dir: str | None = None
    image_size: tuple[int, ...] = ()
    on_bad_image: str = "fail"
    trust_petastorm_metadata: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """How the model is fit.

    Args:
        epochs: Passes over the training split. Defaults to 10.
        batch_size: Global batch size (all replicas together). Defaults to 32.
        learning_rate: Base learning rate, before any world-size scaling. Defaults to 1e-3.
        optimizer: A Keras optimizer name ("adam", "sgd", "rmsprop", "adamw"). Defaults to "adam".
        lr_schedule: "constant" or "cosine" (decay to 0 over all epochs). Defaults to "constant".
        mixed_precision: Use the "mixed_float16" policy. Defaults to False.
        seed: Seed for weights initialisation and dropout. Defaults to 42.
        verbose: Keras ``fit`` verbosity on the chief (0, 1 or 2). Defaults to 2.
    """

    epochs: int = 10
    batch_size: int = 32
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    lr_schedule: str = "constant"
    mixed_precision: bool = False
    seed: int = 42
    verbose: int = 2


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the training runs.

    Args:
        strategy: "auto", "none", "mirrored" or "horovod". Defaults to "auto".
        np: Horovod processes: < 0 runs -np on this host, > 0 runs np Spark tasks. Defaults to 0.
        run_dir: Folder for the resolved config and checkpoints. Defaults to "runs/<recipe>".
        resume: Resume from the last checkpoint in ``run_dir``. Defaults to True.
        lr_scaling: "none" or "linear": multiply the learning rate by the number of replicas.
            ``train.batch_size`` is global, so "none" keeps the optimization the same on any
            world size; use "linear" when you grow the batch with the world. Defaults to "none".
        warmup_epochs: Epochs over which the learning rate ramps up to its (scaled) value.
            Defaults to 0.
        fp16_allreduce: Horovod: send gradients as float16 (half the bytes). Defaults to False.
        start_timeout: Horovod: seconds to wait for all processes or Spark tasks to start before
            failing. Defaults to 120.
        bind_address: Address the servers keras_dl starts listen on: Horovod's rendezvous,
            driver and task services for ``np < 0``, and the Spark driver on a local master.
            Widen it (e.g. "0.0.0.0") only on a trusted network: these services accept
            pickles. With ``np > 0`` Spark executors must reach the driver, so there it is used
            only when set. Defaults to "127.0.0.1".
        spark_ui: Start the Spark web UI in Spark sessions keras_dl creates. Defaults to False.
    """

    strategy: str = "auto"
    np: int = 0
    run_dir: str = ""
    resume: bool = True
    lr_scaling: str = "none"
    warmup_epochs: float = 0.0
    fp16_allreduce: bool = False
    start_timeout: int = 120
    bind_address: str = "127.0.0.1"
    spark_ui: bool = False


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking.

    Args:
        uri: Tracking URI. Defaults to a SQLite file ``mlflow.db`` in the working directory.
        experiment: MLflow experiment name. Defaults to the recipe name.
        registered_model: Registry name for the trained model. Defaults to the recipe name;
            set it to "none" to skip registration.
        log_model: Log the trained model with its signature. Defaults to True.
    """

    uri: str = ""
    experiment: str = ""
    registered_model: str = ""
    log_model: bool = True


@dataclass(frozen=True)
class CallbacksConfig:
    """The default callbacks: early stopping, checkpoints, throughput, plots.

    Args:
        monitor: Metric early stopping watches. Defaults to "val_loss".
        mode: "min", "max" or "auto" (max for accuracy-like names). Defaults to "auto".
        min_delta: Smallest change that counts as an improvement. Defaults to 0.0.
        patience: Epochs without improvement before stopping; None never stops on patience.
            Defaults to None.
        stopping_threshold: Stop as soon as ``monitor`` is better than this. Defaults to None.
        divergence_threshold: Stop as soon as ``monitor`` is worse than this. Defaults to None.
        check_finite: Stop on a NaN or infinite loss or monitored value. Defaults to True.
        restore_best_weights: Restore the best epoch's weights when stopping early.
            Defaults to False.
        checkpoint_every_n_steps: Also checkpoint every N steps (0: each epoch only).
            Defaults to 0.
        keep_checkpoints: Checkpoints kept in ``runtime.run_dir``/checkpoints. Defaults to 3.
        log_every_n_steps: Also log step metrics and throughput every N steps (0: per epoch
            only). Defaults to 0.
        plots: Log loss/metric curves (and a confusion matrix for classifiers) as PNG
            artifacts at the end. Defaults to True.
    """

    monitor: str = "val_loss"
    mode: str = "auto"
    min_delta: float = 0.0
    patience: int | None = None
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    check_finite: bool = True
    restore_best_weights: bool = False
    checkpoint_every_n_steps: int = 0
    keep_checkpoints: int = 3
    log_every_n_steps: int = 0
    plots: bool = True


@dataclass(frozen=True)
class Experiment:
    """One training run: a recipe name plus its four config sections and the recipe's model config.

    ``model`` is a frozen dataclass defined by the recipe (or None); ``--set model.KEY=VALUE``
    overrides it like any other section.
    """

    recipe: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    model: Any = None

    def sections(self) -> dict[str, Any]:
        """The config sections by name, the recipe's ``model`` section included when present."""
        out = {s: getattr(self, s) for s in ("data", "train", "runtime", "tracking", "callbacks")}
        if self.model is not None:
            out["model"] = self.model
        return out


def resolve(
    defaults: Experiment, config_file: str | os.PathLike | None = None, sets: Iterable[str] = ()
) -> Experiment:
    """Apply a YAML file, then ``--set`` overrides, to a recipe's defaults, and validate.

    Args:
        defaults: The recipe's default experiment.
        config_file: YAML file of ``{section: {key: value}}``. Defaults to None.
        sets: ``section.key=value`` strings; values are parsed as YAML scalars. Defaults to ().

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
    return validate(exp)


def read_yaml(path: str | os.PathLike) -> dict:
    """Read a config YAML file into a ``{section: {key: value}}`` mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file {str(p)!r} does not exist. Pass an existing YAML file.")
    try:
        loaded = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"Config file {str(p)!r} must hold a mapping of sections.")
    loaded.pop("recipe", None)
    return loaded


def parse_set(item: str) -> dict:
    """Turn ``"train.epochs=3"`` into ``{"train": {"epochs": 3}}``."""
    key, sep, raw = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(
            f"--set {item!r} is not of the form section.key=value (for example "
            f"--set train.epochs=5). Valid keys: {', '.join(valid_keys(Experiment(model=None)))}."
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return {section: {name: value}}


def apply_mapping(exp: Experiment, mapping: Mapping, origin: str = "config") -> Experiment:
    """Return ``exp`` with the values of ``{section: {key: value}}`` applied (type-checked)."""
    sections = exp.sections()
    changes = {}
    for section, values in mapping.items():
        if section not in sections:
            raise ConfigError(
                f"Unknown config section {section!r} in {origin}. Valid sections: "
                f"{', '.join(sections)}. Valid keys: {', '.join(valid_keys(exp))}."
            )
        if not isinstance(values, Mapping):
            raise ConfigError(f"Section {section!r} in {origin} must be a mapping of key: value.")
        current = changes.get(section, sections[section])
        hints = typing.get_type_hints(type(current))
        updates = {}
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    # The section's keys only: every key of every section no longer reads
                    # as one short paragraph.
                    f"Unknown config key '{section}.{key}' in {origin}. Valid keys in "
                    f"{section!r}: {', '.join(f'{section}.{h}' for h in hints)}. Other sections: "
                    f"{', '.join(s for s in sections if s != section)}."
                )
            updates[key] = _coerce(value, hints[key], f"{section}.{key}", origin)
        changes[section] = dataclasses.replace(current, **updates)
    return dataclasses.replace(exp, **changes)


def validate(exp: Experiment) -> Experiment:
    """Check the settings that a type alone cannot, and fill in recipe-derived defaults."""
    if exp.train.epochs < 1:
        raise ConfigError(f"train.epochs must be >= 1, got {exp.train.epochs}.")
    if exp.train.batch_size < 1:
        raise ConfigError(f"train.batch_size must be >= 1, got {exp.train.batch_size}.")
    if exp.train.learning_rate <= 0:
        raise ConfigError(f"train.learning_rate must be > 0, got {exp.train.learning_rate}.")
    if exp.train.lr_schedule not in ("constant", "cosine"):
        raise ConfigError(
            f"train.lr_schedule={exp.train.lr_schedule!r} is not one of constant, cosine."
        )
    if exp.runtime.strategy not in STRATEGIES:
        raise ConfigError(
            f"runtime.strategy={exp.runtime.strategy!r} is not one of {', '.join(STRATEGIES)}."
        )
    if exp.runtime.lr_scaling not in ("none", "linear"):
        raise ConfigError(
            f"runtime.lr_scaling={exp.runtime.lr_scaling!r} is not one of none, linear."
        )
    if exp.runtime.warmup_epochs < 0 or exp.runtime.start_timeout < 1:
        raise ConfigError("runtime.warmup_epochs must be >= 0 and runtime.start_timeout >= 1.")
    if exp.runtime.np != 0 and exp.runtime.strategy != "horovod":
        raise ConfigError(
            f"runtime.np={exp.runtime.np} launches Horovod processes, but runtime.strategy="
            f"{exp.runtime.strategy!r}. Add --set runtime.strategy=horovod, or drop runtime.np."
        )
    if exp.data.workers < 1:
        raise ConfigError(f"data.workers must be >= 1, got {exp.data.workers}.")
    if exp.data.on_bad_image not in ("fail", "skip"):
        raise ConfigError(f"data.on_bad_image={exp.data.on_bad_image!r} is not one of fail, skip.")
    if exp.data.image_size and (len(exp.data.image_size) != 2 or min(exp.data.image_size) < 1):
        raise ConfigError(
            f"data.image_size={list(exp.data.image_size)} must be two positive integers "
            "(height, width), e.g. --set data.image_size=128,128."
        )
    if exp.callbacks.mode not in ("auto", "min", "max"):
        raise ConfigError(f"callbacks.mode={exp.callbacks.mode!r} is not one of auto, min, max.")
    if exp.callbacks.keep_checkpoints < 1:
        raise ConfigError(
            f"callbacks.keep_checkpoints must be >= 1, got {exp.callbacks.keep_checkpoints}."
        )
    if exp.data.version is not None and exp.data.timestamp:
        raise ConfigError("Set data.version or data.timestamp, not both.")
    if not exp.data.table:
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


def default_tracking_uri() -> str:
    """A SQLite file ``mlflow.db`` in the working directory."""
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def valid_keys(exp: Experiment) -> list[str]:
    """Every ``section.key`` that ``--set`` accepts for this experiment."""
    return [
        f"{name}.{f.name}"
        for name, section in exp.sections().items()
        for f in dataclasses.fields(section)
    ]


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
    """Write the resolved config as YAML (atomically) and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(exp), sort_keys=False))
    os.replace(tmp, p)
    return p


def _coerce(value: Any, hint: Any, key: str, origin: str) -> Any:
    """Check ``value`` against a field's type hint, converting the few safe cases."""
    origin_type = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin_type in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key, origin)
    if origin_type is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            if args[0] is not str:  # "32,32" for a tuple of ints: parse each item as YAML
                value = [yaml.safe_load(v) for v in value]
        if value is None:
            value = []
        if not isinstance(value, (list, tuple)):
            raise _type_error(key, value, "a list", origin)
        return tuple(_coerce(v, args[0], key, origin) for v in value)
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
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _type_error(key, value, "a number", origin)
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(key, value, "a string", origin)
    return value


def _type_error(key: str, value: Any, expected: str, origin: str) -> ConfigError:
    return ConfigError(
        f"Config key {key!r} got {value!r} ({type(value).__name__}) from {origin}, but it must be "
        f"{expected}. Fix the value, for example --set {key}=<{expected}>."
    )
