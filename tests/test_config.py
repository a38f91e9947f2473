import dataclasses

import pytest
import yaml

from keras_dl.config import (
    DataConfig,
    Experiment,
    TrainConfig,
    resolve,
    save,
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
        ("train.batch_size=0", "must be >= 1"),
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
    path = save(exp, tmp_path / "run" / "config.yaml")
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
