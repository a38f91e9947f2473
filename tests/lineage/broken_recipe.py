"""The tabular recipe, whose ``prepare`` fails with an error of its own (a RuntimeError, not
keras_dl's) while ``BREAK`` is set in the environment: a bug in a user's recipe code, met by
``keras-dl retrain-without`` (tests/lineage/test_retrain_without.py)."""

from __future__ import annotations

import dataclasses
import os

from recipes.tabular import RECIPE as TABULAR

BREAK = "KERAS_DL_TEST_BREAK_RECIPE"


def prepare(exp):
    if os.environ.get(BREAK):
        raise RuntimeError("the recipe's own prepare failed")
    return TABULAR.prepare(exp)


RECIPE = dataclasses.replace(TABULAR, prepare=prepare)
