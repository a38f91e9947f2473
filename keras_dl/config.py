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
import datetime
import difflib
import math
import os
import re
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
        cache: "auto" keeps a split's decoded rows in memory after its first epoch when they
            fit ``cache_max_bytes`` (later epochs skip the reader; rows stay exactly once per
            epoch and reshuffled), "never" reads every epoch from the table. Defaults to "auto".
        cache_max_bytes: Memory budget per split (and per process) for ``cache``. Defaults to
            268435456 (256 MiB).
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
    cache: str = "auto"
    cache_max_bytes: int = 256 << 20
    image_size: tuple[int, ...] = ()
    on_bad_image: str = "fail"
    trust_petastorm_metadata: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """How the model is fit.

    Args:
        epochs: Passes over the training split. Defaults to 10.
        batch_size: Global batch size (all replicas together). Defaults to 32.

    ``epochs`` and ``batch_size`` may be null (None) only in a recipe whose own default is null:
    that recipe chooses them from the training table before training (see
    :func:`keras_dl.recipe.configure`; the tabular recipe does). Elsewhere null is refused.
        learning_rate: Base learning rate, before any world-size scaling. Defaults to 1e-3.
        optimizer: A Keras optimizer name ("adam", "sgd", "rmsprop", "adamw"). Defaults to "adam".
        lr_schedule: "constant" or "cosine" (decay to 0 over all epochs). Defaults to "constant".
        mixed_precision: Use the "mixed_float16" policy. Defaults to False.
        seed: Seed for weights initialisation and dropout. Defaults to 42.
        verbose: Keras ``fit`` verbosity on the chief (0, 1 or 2). Defaults to 2.
    """

    epochs: int | None = 10
    batch_size: int | None = 32
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
        run_dir: Folder for the resolved config and checkpoints: a local path or an ``s3://``
            URI (checkpoints counted by manifests, the run lock a lease; see
            :mod:`keras_dl.callbacks.remote_checkpoints`). Defaults to "runs/<recipe>".
        resume: Resume from the last checkpoint in ``run_dir``. Defaults to True.
        lr_scaling: "none" or "linear": multiply the learning rate by the number of replicas.
            ``train.batch_size`` is global, so "none" keeps the optimization the same on any
            world size; use "linear" when you grow the batch with the world. Defaults to "none".
        warmup_epochs: Epochs over which the learning rate ramps up to its (scaled) value.
            Defaults to 0.
        fp16_allreduce: Horovod: send gradients as float16 (half the bytes). Defaults to False.
        start_timeout: Horovod: seconds to wait for all processes or Spark tasks to start before
            failing. Defaults to 120.
        max_restarts: Horovod: relaunch the job from its newest checkpoint, in the same MLflow
            run, when a rank dies or is preempted, up to this many times. Python errors are
            never retried. Defaults to 0 (as TF Model Garden's ``recovery_max_trials``).
        stall_timeout: Horovod: a rank that waits longer than this many seconds for the others
            in a collective (an allreduce, a broadcast) ends the job, naming the ranks that did
            not join and the collective. Defaults to 120.
        bind_address: Address the servers keras_dl starts listen on: Horovod's rendezvous,
            driver and task services for ``np < 0``, and the Spark driver on a local master.
            Widen it (e.g. "0.0.0.0") only on a trusted network: these services accept
            pickles. With ``np > 0`` Spark executors must reach the driver, so there it is used
            only when set. Defaults to "127.0.0.1".
        spark_ui: Start the Spark web UI in Spark sessions keras_dl creates. Defaults to False.
        lease_seconds: With ``run_dir`` on S3: how long the run's lease (its lock) lasts unless
            renewed; the training renews it every third of that, and a run whose holder died
            can start once it lapses. Defaults to 60.
    """

    strategy: str = "auto"
    np: int = 0
    run_dir: str = ""
    resume: bool = True
    lr_scaling: str = "none"
    warmup_epochs: float = 0.0
    fp16_allreduce: bool = False
    start_timeout: int = 120
    max_restarts: int = 0
    stall_timeout: int = 120
    bind_address: str = "127.0.0.1"
    spark_ui: bool = False
    lease_seconds: float = 60.0


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking.

    Args:
        uri: Tracking URI. Defaults to a SQLite file ``mlflow.db`` in the working directory.
        experiment: MLflow experiment name. Defaults to the recipe name.
        registered_model: Registry name for the trained model. Defaults to the recipe name;
            set it to "none" to skip registration.
        log_model: Log the trained model with its signature. Defaults to True.
        artifact_location: Where a new MLflow experiment keeps its artifacts (the model,
            plots), e.g. ``s3://bucket/mlflow``; credentials and endpoint come from the
            standard AWS environment. An existing experiment with another location is an
            error. Defaults to "" (MLflow's default; ``mlartifacts/`` beside a SQLite store).
    """

    uri: str = ""
    experiment: str = ""
    registered_model: str = ""
    log_model: bool = True
    artifact_location: str = ""


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
        divergence_factor: Stop, and fail the run as diverged, when an epoch's training loss
            is more than this many times the first epoch's; 0 disables it. Defaults to 10.0.
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
    divergence_factor: float = 10.0
    restore_best_weights: bool = False
    checkpoint_every_n_steps: int = 0
    keep_checkpoints: int = 3
    log_every_n_steps: int = 0
    plots: bool = True


@dataclass(frozen=True)
class RegistryConfig:
    """What a trained model must show before it is registered (see :mod:`keras_dl.gate`).

    Whatever is set here, a model is registered only when its evaluation metric beats the
    trivial predictor on the same rows (the training majority class, or the training mean).

    Args:
        min_metric: A floor "NAME OP NUMBER" on an evaluation metric, OP one of >=, >, <=, <,
            e.g. "test_accuracy>=0.95". Defaults to "" (none).
        must_beat: An alias of the registered model, e.g. "champion": the new model must beat
            the version holding it on the same evaluation rows (passes when no version holds
            it yet). Defaults to "" (none).
        set_alias: An alias moved to the new version once it is registered, e.g. "champion".
            Defaults to "" (none).
    """

    min_metric: str = ""
    must_beat: str = ""
    set_alias: str = ""


@dataclass(frozen=True)
class Experiment:
    """One training run: a recipe name plus its config sections and the recipe's model config.

    ``model`` is a frozen dataclass defined by the recipe (or None); ``--set model.KEY=VALUE``
    overrides it like any other section.
    """

    recipe: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    model: Any = None

    def sections(self) -> dict[str, Any]:
        """The config sections by name, the recipe's ``model`` section included when present."""
        names = ("data", "train", "runtime", "tracking", "callbacks", "registry")
        out = {s: getattr(self, s) for s in names}
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
    _check_chosen_by_recipe(defaults, exp)
    return exp


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


def validate(exp: Experiment) -> Experiment:
    """Check the settings that a type alone cannot, and fill in recipe-derived defaults."""
    _check_finite(exp)  # a NaN passes every "<" and ">" test below
    if not exp.train.learning_rate > 0:
        raise ConfigError(
            f"train.learning_rate must be a finite number > 0, got {exp.train.learning_rate}."
        )
    for key in _AT_LEAST_ONE:
        _check_min(exp, key, 1)
    for key in _AT_LEAST_ZERO:
        _check_min(exp, key, 0)
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
    if exp.runtime.np != 0 and exp.runtime.strategy != "horovod":
        raise ConfigError(
            f"runtime.np={exp.runtime.np} launches Horovod processes, but runtime.strategy="
            f"{exp.runtime.strategy!r}. Add --set runtime.strategy=horovod, or drop runtime.np."
        )
    if exp.data.workers < 1:
        raise ConfigError(f"data.workers must be >= 1, got {exp.data.workers}.")
    if exp.data.cache not in ("auto", "never") or exp.data.cache_max_bytes < 0:
        raise ConfigError(
            f"data.cache={exp.data.cache!r} must be auto or never, and data.cache_max_bytes="
            f"{exp.data.cache_max_bytes} at least 0."
        )
    if exp.data.on_bad_image not in ("fail", "skip"):
        raise ConfigError(f"data.on_bad_image={exp.data.on_bad_image!r} is not one of fail, skip.")
    if exp.data.image_size and (len(exp.data.image_size) != 2 or min(exp.data.image_size) < 1):
        raise ConfigError(
            f"data.image_size={list(exp.data.image_size)} must be two positive integers "
            "(height, width), e.g. --set data.image_size=128,128."
        )
    if exp.callbacks.divergence_factor != 0 and not exp.callbacks.divergence_factor > 1:
        raise ConfigError(
            f"callbacks.divergence_factor={exp.callbacks.divergence_factor:g} must be 0 (off) "
            "or greater than 1, e.g. --set callbacks.divergence_factor=10."
        )
    _check_registry(exp.registry)
    if exp.callbacks.mode not in ("auto", "min", "max"):
        raise ConfigError(f"callbacks.mode={exp.callbacks.mode!r} is not one of auto, min, max.")
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
    tmp.write_text(dumps(exp))
    os.replace(tmp, p)
    return p


def dumps(exp: Experiment) -> str:
    """The resolved config as YAML text (what :func:`save` writes)."""
    return yaml.safe_dump(to_dict(exp), sort_keys=False)


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
        return _coerce(value, inner[0], key, origin)
    if origin_type is tuple:
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


# Settings that only make sense from 1 (counts, sizes) or from 0 (offsets, intervals).
_AT_LEAST_ONE = (
    "train.epochs",
    "train.batch_size",
    "data.workers",
    "data.shuffle_buffer",
    "runtime.start_timeout",
    "runtime.stall_timeout",
    "runtime.lease_seconds",
    "callbacks.keep_checkpoints",
)
_AT_LEAST_ZERO = (
    "runtime.warmup_epochs",
    "runtime.max_restarts",
    "callbacks.min_delta",
    "callbacks.checkpoint_every_n_steps",
    "callbacks.log_every_n_steps",
    "callbacks.patience",
)


# Settings a recipe may leave null in its defaults, to choose them from the table itself.
CHOSEN_BY_RECIPE = ("train.epochs", "train.batch_size")


def _check_chosen_by_recipe(defaults: Experiment, exp: Experiment) -> None:
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


def parse_min_metric(text: str) -> tuple[str, str, float]:
    """``"test_accuracy >= 0.95"`` as ``("test_accuracy", ">=", 0.95)``.

    Raises:
        ConfigError: When ``text`` is not "NAME OP NUMBER" with OP one of >=, >, <=, <.
    """
    for op in METRIC_OPS:
        name, found, number = text.partition(op)
        if not found:
            continue
        value = _parse_float(number.strip())
        if name.strip() and value is not None and math.isfinite(value):
            return name.strip(), op, value
        break
    raise ConfigError(
        f"registry.min_metric={text!r} is not NAME OP NUMBER with OP one of "
        f"{', '.join(METRIC_OPS)}, e.g. --set registry.min_metric=test_accuracy>=0.95."
    )


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


def _check_min(exp: Experiment, key: str, low: int) -> None:
    section, name = key.split(".")
    value = getattr(getattr(exp, section), name)
    if value is not None and value < low:
        raise ConfigError(f"{key} must be >= {low}, got {value}. Fix it with --set {key}=...")


def _type_error(key: str, value: Any, expected: str, origin: str) -> ConfigError:
    return ConfigError(
        f"Config key {key!r} got {value!r} ({type(value).__name__}) from {origin}, but it must be "
        f"{expected}. Fix the value, for example --set {key}=<{expected}>."
    )
