"""Errors a user can act on.

Every error raised for bad input is a :class:`KerasDLError`. The CLI prints its message as one
paragraph and exits non-zero; library callers catch it like any exception. The message names the
table, file, column or key at fault and says how to fix it.
"""

from __future__ import annotations


class KerasDLError(Exception):
    """A problem with the user's input or environment, explained in the message."""

    exit_code = 2  # the CLI's exit status for this error


class DivergenceError(KerasDLError):
    """Training diverged: a loss, metric or weight became NaN or infinite.

    Not retried by automatic recovery: the same settings would diverge again.
    """

    exit_code = 3


class ConfigError(KerasDLError, ValueError):
    """An unknown config key, a badly typed value, or an inconsistent setting."""


class DataError(KerasDLError):
    """A table, file, column or row group that cannot be read as asked."""


class DistributedError(KerasDLError):
    """A distributed setup that cannot run (too few shards, missing Horovod, no free slots...)."""
