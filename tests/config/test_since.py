"""data.since_version / data.since_timestamp: parsed from --set, and checked before any read."""

import pytest

from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from tests.config.test_config import defaults


def test_since_version_is_set_from_the_command_line():
    exp = resolve(defaults(), sets=["data.since_version=3", "data.version=5"])
    assert (exp.data.since_version, exp.data.version) == (3, 5)
    assert resolve(defaults()).data.since_version is None


@pytest.mark.parametrize(
    "sets, message",
    [
        (["data.since_version=-1"], r"data.since_version=-1 is negative"),
        (
            ["data.since_version=1", "data.since_timestamp=2026-01-01T00:00:00"],
            r"data.since_version or data.since_timestamp, not both",
        ),
    ],
)
def test_bad_since_settings_are_refused_by_name(sets, message):
    with pytest.raises(ConfigError, match=message):
        resolve(defaults(), sets=sets)
