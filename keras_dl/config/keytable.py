"""The key tables of ``docs/configuration.md``, derived from the schema's fields.

A key's row is ``| `section.key` | default | meaning |``. Its meaning is the field's entry in
its section docstring's ``Args:`` (Google style), its default that entry's "Defaults to ..."
clause (or the field's own default when the entry has none), and its declared range
(:func:`~keras_dl.config.bounds.setting`) is appended as "Range: ...". The docs keep each
table between ``<!-- keys:SECTION -->`` and ``<!-- /keys:SECTION -->``; rewrite them with::

    python -m keras_dl.config.keytable --write docs/configuration.md

The recipe's ``model`` section is the recipe's own, so it has no table here.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

from keras_dl.config.bounds import BOUNDS
from keras_dl.config.schema import Experiment

WRITE_COMMAND = "python -m keras_dl.config.keytable --write docs/configuration.md"
HEADER = ("| key | default | meaning |", "|---|---|---|")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")  # :mod:`keras_dl.trivial` -> `keras_dl.trivial`
_DOC_LINK = re.compile(r"\bdocs/([\w-]+\.md)(#[\w-]+)?")  # docs/storage.md#x -> a link
_DEFAULTS = re.compile(r"\s*\bDefaults to (.*?)\.?$", re.S)


def sections() -> dict[str, type]:
    """The documented sections by name: every section of :class:`Experiment` but ``model``."""
    return {name: type(s) for name, s in Experiment().sections().items() if name != "model"}


def field_docs(cls: type) -> dict[str, str]:
    """``{field: its Args: entry}`` of ``cls``'s docstring, each entry on one line."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    start = lines.index("Args:") + 1 if "Args:" in lines else len(lines)
    docs: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("    "):  # a blank line or the next section ends Args:
            break
        entry = re.match(r"    (\w+): (.*)", line)
        if entry:
            docs[entry[1]] = [entry[2]]
        else:
            next(reversed(docs.values())).append(line.strip())
    return {name: " ".join(words) for name, words in docs.items()}


def _markdown(text: str) -> str:
    """Docstring markup as the docs write it: ``x`` and roles as `x`, docs/*.md as links."""
    text = _ROLE.sub(r"``\1``", text).replace("``", "`").replace("|", "\\|")
    return _DOC_LINK.sub(lambda m: f"[{m[1]}]({m[1]}{m[2] or ''})", text)


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return f"{value:g}" if isinstance(value, float) else str(value)


def rows(name: str, cls: type) -> dict[str, str]:
    """``{section.key: its markdown row}`` for every field of the section ``cls``, in order."""
    docs = field_docs(cls)
    out = {}
    for f in dataclasses.fields(cls):
        key = f"{name}.{f.name}"
        if f.name not in docs:
            raise ValueError(f"{cls.__name__}'s docstring has no Args: entry for {f.name}")
        meaning, default = docs[f.name], f"`{_literal(f.default)}`"
        clause = _DEFAULTS.search(meaning)
        if clause:
            meaning, default = meaning[: clause.start()], clause[1]
        if meaning and not meaning.endswith("."):
            meaning += "."
        bounds = f.metadata.get(BOUNDS)
        if bounds is not None:
            meaning += f" Range: {bounds}."
        out[key] = f"| `{key}` | {_markdown(default)} | {_markdown(meaning)} |"
    return out


def table(name: str) -> str:
    """The section's whole table, header included, between its markers."""
    body = "\n".join((*HEADER, *rows(name, sections()[name]).values()))
    return f"<!-- keys:{name} -->\n\n{body}\n\n<!-- /keys:{name} -->"  # blank lines: own blocks


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- keys:{name} -->\n.*?<!-- /keys:{name} -->", re.S)


def documented_rows(text: str) -> dict[str, list[str]]:
    """``{section: the rows between its markers}`` in a docs page (absent markers: no entry)."""
    out = {}
    for name in sections():
        block = _block(name).search(text)
        if block:
            out[name] = [line for line in block[0].splitlines() if line.startswith("| `")]
    return out


def write(path: str | Path) -> bool:
    """Rewrite every section's table in the page at ``path``; True when it changed.

    Raises:
        ValueError: When the page lacks a section's markers.
    """
    path = Path(path)
    text = old = path.read_text()
    for name in sections():
        if not _block(name).search(text):
            raise ValueError(f"{path} has no <!-- keys:{name} --> ... <!-- /keys:{name} -->")
        text = _block(name).sub(lambda _, n=name: table(n), text)
    path.write_text(text)
    return text != old


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PAGE", help="rewrite the tables in this page")
    args = parser.parse_args(argv)
    if args.write:
        print(f"{args.write}: {'updated' if write(args.write) else 'up to date'}")
    else:
        print("\n\n".join(table(name) for name in sections()))


if __name__ == "__main__":
    main()
