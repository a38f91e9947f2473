"""Checks of a mixed training split's settings: ``data.sources``, ``data.epoch_rows`` and
``data.replay`` (the rules between them; each key's type is checked when it is parsed)."""

from __future__ import annotations

import math
import re

from keras_dl.config.schema import DataConfig
from keras_dl.errors import ConfigError

NAME = re.compile(r"^[A-Za-z0-9_-]+$")
EXAMPLE = "--set 'data.sources=[{name: old, table: t1, weight: 0.7}, {name: new, table: t2, weight: 0.3}]'"


def check_sources(data: DataConfig) -> None:
    """Refuse a mix that cannot be planned, naming the source and key.

    Raises:
        ConfigError: A source without a name or table, two sources of one name, a weight
            that is negative or not finite, weights all 0, a negative version, an
            ``epoch_rows`` without a mix, a ``replay`` without ``data.since_version`` or with
            ``data.sources``. (Their ranges are declared on the fields: ``check_bounds``.)
    """
    seen: set[str] = set()
    for i, source in enumerate(data.sources):
        where = f"data.sources[{i}]" + (f" ({source.name!r})" if source.name else "")
        if not NAME.match(source.name):
            raise ConfigError(
                f"{where}.name={source.name!r} must be letters, digits, '_' or '-' (it names "
                f"the metrics rows_trained/<name>), e.g. {EXAMPLE}."
            )
        if source.name in seen:
            raise ConfigError(
                f"{where}: two sources are named {source.name!r}. Give each its own name."
            )
        seen.add(source.name)
        if not source.table:
            raise ConfigError(
                f"{where}.table is empty. Point it at the source's table, e.g. {EXAMPLE}."
            )
        if not (math.isfinite(source.weight) and source.weight >= 0):
            raise ConfigError(
                f"{where}.weight={source.weight} must be a finite number >= 0 (its share of "
                "each epoch, relative to the other sources')."
            )
        for key in ("version", "since_version"):
            value = getattr(source, key)
            if value is not None and value < 0:
                raise ConfigError(f"{where}.{key}={value} is negative: it names a Delta version.")
        if (
            source.version is not None
            and source.since_version is not None
            and source.since_version >= source.version
        ):
            raise ConfigError(
                f"{where}: since_version={source.since_version} must be below version="
                f"{source.version} (the rows added after it, up to it)."
            )
    if data.sources and not any(s.weight > 0 for s in data.sources):
        raise ConfigError(
            "data.sources: every weight is 0, so no epoch has rows. Give a source a weight > 0."
        )
    if data.epoch_rows is not None and not data.sources and data.replay is None:
        raise ConfigError(
            f"data.epoch_rows={data.epoch_rows} sets the rows of a mixed epoch, but neither "
            "data.sources nor data.replay is set. Drop data.epoch_rows, or mix sources."
        )
    if data.replay is not None:
        if data.since_version is None:
            raise ConfigError(
                f"data.replay={data.replay} replays the rows at or before data.since_version, "
                "which is not set. Add --set data.since_version=N (the champion's version)."
            )
        if data.sources:
            raise ConfigError(
                "data.replay is a two-source mix of data.table; with data.sources set, add the "
                "replayed rows as a source of their own (with its version) instead."
            )
