"""data.sources, data.epoch_rows and data.replay: parsed from YAML and --set, checked by name."""

import pytest
import yaml

from keras_dl.config import SourceConfig, dumps, resolve
from keras_dl.errors import ConfigError
from tests.config.test_config import defaults

FLOW = "data.sources=[{name: old, table: t1, weight: 0.7}, {name: new, table: t2, weight: 0.3, version: 4, filters: [label < 5]}]"


def test_sources_come_from_set_in_yaml_flow_style():
    exp = resolve(defaults(), sets=[FLOW, "data.epoch_rows=100"])
    assert exp.data.sources == (
        SourceConfig("old", "t1", 0.7),
        SourceConfig("new", "t2", 0.3, version=4, filters=("label < 5",)),
    )
    assert exp.data.epoch_rows == 100


def test_sources_come_from_a_config_file_and_its_dump_reads_back(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "sources": {
                        "old": {"table": "t1", "weight": 0.7, "since_version": 1},
                        "new": {"table": "t2", "weight": "0.3"},
                    }
                }
            },
            sort_keys=False,
        )
    )
    exp = resolve(defaults(), path)
    assert exp.data.sources == (
        SourceConfig("old", "t1", 0.7, since_version=1),
        SourceConfig("new", "t2", 0.3),
    )
    saved = tmp_path / "saved.yaml"
    saved.write_text(dumps(exp))
    assert resolve(defaults(), saved).data.sources == exp.data.sources


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["data.sources=[{name: a, table: t, weight: -1}]"],
            r"data.sources\[0\] \('a'\).weight=-1",
        ),
        (["data.sources=[{name: a, table: t}, {name: a, table: u}]"], r"two sources are named 'a'"),
        (["data.sources=[{name: a b, table: t}]"], r"data.sources\[0\] \('a b'\).name"),
        (["data.sources=[{name: a}]"], r"data.sources\[0\] \('a'\).table is empty"),
        (
            ["data.sources=[{name: a, table: t, wieght: 1}]"],
            r"Unknown key 'wieght' in data.sources\[0\]",
        ),
        (["data.sources=[{name: a, table: t, weight: x}]"], r"data.sources\[0\].weight"),
        (["data.sources=[{name: a, table: t, weight: 0}]"], r"every weight is 0"),
        (
            ["data.sources=[{name: a, table: t, version: 2, since_version: 2}]"],
            r"since_version=2 must be below",
        ),
        (["data.epoch_rows=10"], r"neither data.sources nor data.replay"),
        (["data.epoch_rows=0"], r"data.epoch_rows=0 is outside the allowed range >= 1"),
        (["data.replay=0.3"], r"data.since_version, which is not set"),
        (
            ["data.replay=1", "data.since_version=1"],
            r"data.replay=1.0 is outside the allowed range \(0, 1\).*--set data.replay=0.3",
        ),
    ],
)
def test_bad_mixes_are_refused_naming_the_source_and_key(sets, message):
    with pytest.raises(ConfigError, match=message):
        resolve(defaults(), sets=sets)


def test_replay_is_one_setting_beside_since_version():
    exp = resolve(defaults(), sets=["data.since_version=2", "data.replay=0.3"])
    assert (exp.data.since_version, exp.data.replay, exp.data.sources) == (2, 0.3, ())
