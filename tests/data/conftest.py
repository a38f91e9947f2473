"""Fixtures of the data tests."""

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "delta"


@pytest.fixture
def copy(tmp_path):
    """Copy a fixture table to a temporary folder (tests never write into the fixtures)."""

    def make(name: str) -> str:
        target = tmp_path / name
        shutil.copytree(FIXTURES / name, target)
        return str(target)

    return make
