import dataclasses

import pytest
import yaml

from keras_dl.config import (
    CHOSEN_BY_RECIPE,
    DataConfig,
    Experiment,
    TrainConfig,
    chosen_by_recipe_keys,
    dumps,
    free_on_resume_keys,
    resolve,
    to_flat_dict,
    valid_keys,
)
from keras_dl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ToyModel:
    units: int = 8


def defaults() -> Experiment:
    return Experiment(
        recipe="toy",
        data=DataConfig(table="/tmp/t"),
        train=TrainConfig(epochs=2),
        model=ToyModel(),
    )


def test_defaults_match_the_documented_values():
    exp = resolve(defaults())
    assert exp.train.batch_size == 32
    assert exp.train.learning_rate == 1e-3
    assert exp.train.mixed_precision is False
    assert exp.tracking.uri.startswith("sqlite:///") and exp.tracking.uri.endswith("mlflow.db")
    assert exp.tracking.registered_model == "toy"
    assert exp.runtime.run_dir == "runs/toy"
    assert exp.runtime.stall_timeout == 120


def test_overrides_apply_defaults_then_yaml_then_sets_in_order(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump({"train": {"epochs": 7, "batch_size": 64}, "model": {"units": 3}})
    )
    exp = resolve(defaults(), cfg, ["train.epochs=9", "train.epochs=11", "data.features=a,b"])
    assert exp.train.epochs == 11  # the last --set wins over YAML
    assert exp.train.batch_size == 64  # YAML wins over defaults
    assert exp.model.units == 3
    assert exp.data.features == ("a", "b")


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(ConfigError, match=r"Unknown config key 'train.epoch'.*epochs.*batch_size"):
        resolve(defaults(), sets=["train.epoch=3"])
    with pytest.raises(ConfigError, match=r"Unknown config section 'trian'.*data.table"):
        resolve(defaults(), sets=["trian.epochs=3"])


@pytest.mark.parametrize(
    "item, match",
    [
        ("train.epochs=three", "must be an integer"),
        ("train.learning_rate=fast", "must be a number"),
        ("train.mixed_precision=maybe", "must be true or false"),
        ("runtime.strategy=spaceship", "is not one of auto, none, mirrored, horovod"),
        ("train.batch_size=0", "train.batch_size=0 is outside the allowed range >= 1"),
        (
            "data.cache_max_bytes=-1",
            r"data.cache_max_bytes=-1 is outside the allowed range >= 0.*--set",
        ),
        (
            "data.cache_dir_max_bytes=0",
            r"data.cache_dir_max_bytes=0 is outside the allowed range >= 1",
        ),
        (
            "data.cache_dir_max_bytes=1000",
            r"data.cache_dir, which is not set.*--set data.cache_dir=",
        ),
        ("epochs=3", "section.key=value"),
    ],
)
def test_badly_typed_or_invalid_values_stop_before_any_work(item, match):
    with pytest.raises(ConfigError, match=match):
        resolve(defaults(), sets=[item])


def test_optional_and_numeric_values_are_coerced():
    exp = resolve(
        defaults(), sets=["data.version=3", "train.learning_rate=1e-2", "data.version=null"]
    )
    assert exp.data.version is None
    assert exp.train.learning_rate == pytest.approx(0.01)


def test_resolved_config_is_saved_and_flattened(tmp_path):
    exp = resolve(defaults(), sets=["train.epochs=4"])
    path = tmp_path / "config.yaml"
    path.write_text(dumps(exp))
    loaded = yaml.safe_load(path.read_text())
    assert loaded["train"]["epochs"] == 4 and loaded["recipe"] == "toy"
    # The saved file is itself a valid --config file.
    assert resolve(defaults(), path).train.epochs == 4
    flat = to_flat_dict(exp)
    assert set(flat) == {"recipe", *valid_keys(exp)}
    for key in (
        "data.table",
        "data.version",
        "data.label",
        "data.validation_table",
        "train.epochs",
        "train.batch_size",
        "train.learning_rate",
        "train.mixed_precision",
        "runtime.strategy",
        "runtime.np",
        "runtime.run_dir",
        "tracking.uri",
        "tracking.experiment",
        "tracking.registered_model",
    ):
        assert key in flat


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(defaults(), tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "item, key, want",
    [
        # The README's time-travel example: YAML would make it a datetime.
        ("data.timestamp=2026-11-24T06:32:54+00:00", "timestamp", "2026-11-24T06:32:54+00:00"),
        ("data.label=123", "label", "123"),  # a str stays a str, digits or not
        ("data.label=true", "label", "true"),
        ("data.label=null", "label", "null"),  # not Optional: the text itself
        ("data.shuffle=false", "shuffle", False),
        ("data.shuffle=TRUE", "shuffle", True),
        ("data.features=a,b , c", "features", ("a", "b", "c")),
        ("data.features=[x, y]", "features", ("x", "y")),
        ("data.features=", "features", ()),
        ("data.image_size=32,48", "image_size", (32, 48)),
        ("data.version=null", "version", None),
        ("data.version=7", "version", 7),
        ("data.timestamp=null", "timestamp", None),
        (
            "data.filters=year >= 2020,country in US|FR",
            "filters",
            ("year >= 2020", "country in US|FR"),
        ),
    ],
)
def test_each_set_value_is_parsed_by_its_fields_type(item, key, want):
    assert getattr(resolve(defaults(), sets=[item]).data, key) == want


@pytest.mark.parametrize(
    "item, match",
    [
        ("data.shuffle=yes", r"'data.shuffle' got 'yes'.*must be true or false"),
        ("data.shuffle=1", r"must be true or false"),
        ("data.image_size=32,big", r"'data.image_size' got 'big'.*must be an integer"),
        ("data.version=1.5", r"must be an integer"),
        ("train.epochs=null", r"'train.epochs' got 'null'.*must be an integer"),
    ],
)
def test_values_that_do_not_parse_as_the_fields_type_are_refused(item, match):
    with pytest.raises(ConfigError, match=match):
        resolve(defaults(), sets=[item])


def test_yaml_values_get_the_same_parsing(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "data:\n"
        "  timestamp: 2026-11-24T06:32:54+00:00\n"
        "  label: 0042\n"
        "  features: [a, b]\n"
        "  image_size: 8,8\n"
        "  version: null\n"
        "train:\n"
        "  learning_rate: 1e-2\n"
        "  mixed_precision: true\n"
    )
    exp = resolve(defaults(), cfg)
    assert exp.data.timestamp == "2026-11-24T06:32:54+00:00"
    assert exp.data.label == "0042"
    assert exp.data.features == ("a", "b") and exp.data.image_size == (8, 8)
    assert exp.data.version is None
    assert exp.train.learning_rate == pytest.approx(0.01) and exp.train.mixed_precision is True


def test_saved_config_round_trips_through_the_typed_parser(tmp_path):
    exp = resolve(defaults(), sets=["data.timestamp=2026-11-24T06:32:54+00:00", "data.label=7"])
    (tmp_path / "config.yaml").write_text(dumps(exp))
    again = resolve(defaults(), tmp_path / "config.yaml")
    assert again == exp


def test_unknown_keys_and_sections_say_did_you_mean():
    with pytest.raises(ConfigError, match=r"'train.epoch'.*Did you mean train.epochs\?"):
        resolve(defaults(), sets=["train.epoch=3"])
    with pytest.raises(ConfigError, match=r"'trian'.*Did you mean train\?"):
        resolve(defaults(), sets=["trian.epochs=3"])
    with pytest.raises(
        ConfigError, match=r"'data.learning_rate'.*Did you mean train.learning_rate\?"
    ):
        resolve(defaults(), sets=["data.learning_rate=3"])


def test_multiworker_runs_on_spark_tasks_or_here_and_np_needs_a_launching_strategy():
    from keras_dl.config import resolve
    from keras_dl.errors import ConfigError
    from keras_dl.recipe import load_recipe

    defaults = load_recipe("digits").defaults
    for np in (2, -2):  # Spark barrier tasks (keras_dl.launch.spark_workers), or this host
        exp = resolve(defaults, sets=["runtime.strategy=multiworker", f"runtime.np={np}"])
        assert (exp.runtime.strategy, exp.runtime.np) == ("multiworker", np)
    with pytest.raises(ConfigError, match=r"runtime.np=2 launches .*runtime.strategy='mirrored'"):
        resolve(defaults, sets=["runtime.strategy=mirrored", "runtime.np=2"])


# The counts that start at 1 and the offsets that start at 0, as their fields declare them.
AT_LEAST_ONE = (
    "train.epochs",
    "train.batch_size",
    "data.workers",
    "data.io_max_bytes",
    "data.cache_dir_max_bytes",
    "data.shuffle_buffer",
    "runtime.start_timeout",
    "runtime.stall_timeout",
    "runtime.lease_seconds",
    "callbacks.keep_checkpoints",
    "tune.trials",
    "tune.parallelism",
)
AT_LEAST_ZERO = (
    "data.cache_max_bytes",
    "data.io_concurrency",
    "runtime.warmup_epochs",
    "runtime.max_restarts",
    "callbacks.min_delta",
    "callbacks.checkpoint_every_n_steps",
    "callbacks.log_every_n_steps",
    "callbacks.patience",
)


@pytest.mark.parametrize(
    "key, low", [(k, 1) for k in AT_LEAST_ONE] + [(k, 0) for k in AT_LEAST_ZERO]
)
def test_each_count_and_offset_is_refused_below_its_bound_and_accepted_at_it(key, low):
    extra = ["data.cache_dir=/tmp/c"] if key == "data.cache_dir_max_bytes" else []
    resolve(defaults(), sets=[*extra, f"{key}={low}"])
    with pytest.raises(ConfigError) as err:
        resolve(defaults(), sets=[*extra, f"{key}={low - 1}"])
    text = str(err.value)
    assert f"{key}={low - 1}" in text and f">= {low}" in text and f"--set {key}=" in text


def test_the_learning_rate_is_refused_at_0_and_below_by_its_field():
    resolve(defaults(), sets=["train.learning_rate=1e-9"])
    for value in ("0", "-1"):
        with pytest.raises(
            ConfigError,
            match=r"train\.learning_rate=-?[01]\.0 is outside the "
            r"allowed range > 0\. .*--set train\.learning_rate=0\.001",
        ):
            resolve(defaults(), sets=[f"train.learning_rate={value}"])


def test_the_settings_a_recipe_may_choose_are_declared_on_their_fields():
    # Null is refused for every other setting; these two a recipe may leave null in its
    # defaults and choose from the table (keras_dl.recipe.configured).
    assert CHOSEN_BY_RECIPE == ("train.epochs", "train.batch_size")
    assert chosen_by_recipe_keys(defaults().sections()) == CHOSEN_BY_RECIPE


def test_the_settings_a_resume_may_change_are_declared_on_their_fields():
    # The config fingerprint a checkpoint carries leaves exactly these out (with the runtime,
    # tracking, callbacks and registry sections): a change to this set changes every
    # fingerprint, and runs interrupted before it would no longer resume.
    assert free_on_resume_keys(defaults().sections()) == {
        "train.epochs",
        "train.verbose",
        "data.workers",
        "data.cache_dir",
        "data.io_concurrency",
        "data.io_max_bytes",
        "data.cache_dir_max_bytes",
    }
