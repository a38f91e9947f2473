"""docs/configuration.md's key tables are the ones keras_dl.config.keytable derives from the
schema's fields (their docstring entries, defaults and declared ranges)."""

import dataclasses
import re
from collections import Counter
from pathlib import Path

from keras_dl.config import Experiment, keytable

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"
SECTIONS = ("data", "train", "runtime", "tracking", "callbacks", "registry", "tune")
FIX = f"Run `{keytable.WRITE_COMMAND}` (edit the field's docstring in schema.py, not the page)."


def _key(row: str) -> str:
    return re.match(r"\| `([^`]+)` \|", row)[1]


def test_docs_tables_are_the_generated_ones():
    documented = keytable.documented_rows(PAGE.read_text())
    for name, cls in keytable.sections().items():
        assert name in documented, f"{PAGE.name} has no <!-- keys:{name} --> table. {FIX}"
        rows = {_key(row): row for row in documented[name]}
        for key, row in keytable.rows(name, cls).items():
            assert key in rows, f"{PAGE.name} has no row for {key}. {FIX}"
            assert rows[key] == row, (
                f"{PAGE.name}'s row for {key} is not the generated one:\n"
                f"  page:      {rows[key]}\n  generated: {row}\n{FIX}"
            )
        stale = set(rows) - set(keytable.rows(name, cls))
        assert not stale, f"{PAGE.name} documents {sorted(stale)}, not in the schema. {FIX}"
        assert list(rows) == list(keytable.rows(name, cls)), f"{name}'s rows out of order. {FIX}"


def test_every_schema_key_appears_exactly_once():
    counts = Counter(_key(row) for row in PAGE.read_text().splitlines() if row.startswith("| `"))
    sections = Experiment().sections()
    keys = [f"{name}.{f.name}" for name in SECTIONS for f in dataclasses.fields(sections[name])]
    assert set(keytable.sections()) == set(SECTIONS)  # every section but the recipe's model
    for key in keys:
        assert counts[key] == 1, f"{key} has {counts[key]} rows in {PAGE.name}, not 1. {FIX}"


def test_rows_carry_the_fields_facts():
    rows = keytable.rows("data", keytable.sections()["data"])
    # the default as the docstring's "Defaults to" says it, else the field's own default
    assert rows["data.version"].startswith("| `data.version` | the latest | Delta version")
    assert "| `data.features` | `()` |" in rows["data.features"]
    # the declared range appended; markup turned into markdown; "|" escaped in a cell
    assert rows["data.workers"].endswith("(they decode). Range: >= 1. |")
    assert "[storage.md](storage.md#the-local-disk-cache)" in rows["data.cache_dir"]
    assert '"\\|"' in rows["data.filters"]
    train = keytable.rows("train", keytable.sections()["train"])
    assert train["train.learning_rate"].endswith("Range: > 0. |")


def test_write_rewrites_only_the_tables(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text(PAGE.read_text())
    keytable.write(page)
    current = page.read_text()
    stale = current.replace("Rows mixed in memory when shuffling.", "Rows shuffled.")
    assert stale != current
    page.write_text(stale.replace("Back to the", "Back to  the"))  # prose is kept as it is
    assert keytable.write(page)
    assert page.read_text() == current.replace("Back to the", "Back to  the")
    assert not keytable.write(page)
