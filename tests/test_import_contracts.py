"""Imports by string follow the same one-way layers as plain imports (``.importlinter``).

lint-imports sees only ``import`` statements. A module loaded with ``importlib.import_module`` or
``__import__`` hides its arrow from it, so this test reads the source: a constant name of a
keras_dl module must point down the layers (or within one), and a name built at run time, or
one of the first-party packages above keras_dl (``recipes``), must be on ``ALLOWED`` with its
reason. It also checks that every module is placed in a layer, and the Petastorm import hook,
which lives outside the package.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.warm_python import REAL_PYTHON

# (file, function): why it loads a module by a name built at run time, or from above keras_dl:
# the one documented lookup. The CLI imports its commands and the restricted unpickler its few
# classes' modules as plain imports.
ALLOWED = {
    (
        "keras_dl/recipe.py",
        "_import_recipe",
    ): "the recipe registry: recipes/NAME.py is found by its "
    "name; recipes sit above keras_dl and this is the one place that loads them",
    ("keras_dl/extras.py", "import_extra"): "an optional third-party package (pyspark, optuna, "
    "...), never a keras_dl module: its top-level name must be in keras_dl.extras.EXTRAS",
}
ABOVE_KERAS_DL = ("recipes", "tests", "notebooks")
# The top-level import hooks the .pth file loads (outside the package, so no layer holds them).
HOOKS = ("keras_dl_petastorm_hook.py", "keras_dl_keras_hook.py")


def test_no_module_is_loaded_by_string_against_the_layers():
    problems, used = [], set()
    for path in _sources():
        problems += string_import_problems(path.read_text(), _module_name(path), _rel(path), used)
    assert not problems, "\n".join(problems)
    assert used == set(ALLOWED), f"stale ALLOWED entries: {set(ALLOWED) - used}"


def test_the_check_catches_an_upward_load_by_string():
    source = (
        "import importlib\n"
        "def f(name):\n"
        "    importlib.import_module('keras_dl.train')\n"
        "    __import__('keras_dl.data.stream.tfdata')\n"
        "    importlib.import_module(f'recipes.{name}')\n"
        "    importlib.import_module(name)\n"
    )
    problems = string_import_problems(
        source, "keras_dl.data.stream.shard_epochs", "keras_dl/data/stream/shard_epochs.py"
    )
    assert len(problems) == 4, problems
    assert "keras_dl.train" in problems[0] and "keras_dl.data.stream.tfdata" in problems[1]
    downward = "import importlib\nimportlib.import_module('keras_dl.errors')\n"
    assert (
        string_import_problems(
            downward, "keras_dl.data.stream.shard_epochs", "keras_dl/data/stream/shard_epochs.py"
        )
        == []
    )


def test_every_module_is_in_a_layer_of_importlinter():
    # A package's __init__ that no layer names is its folder (keras_dl, keras_dl.distribute,
    # whose modules sit in several layers); every module in it is placed. keras_dl.data's
    # modules are placed in the data contract's layers as well.
    contracts = list(_contracts())
    modules = [_module_name(p) for p in _sources() if p.name not in HOOKS]
    folders = {m for m in modules if any(n.startswith(m + ".") for n in modules)}
    unplaced = [m for m in modules if not any(_layer_of(m, ls) for _, ls in contracts)]
    assert set(unplaced) <= folders, f"in no layer of .importlinter: {set(unplaced) - folders}"
    data_layers = next(ls for name, ls in contracts if name.startswith("keras_dl.data:"))
    in_data = [m for m in modules if m.startswith("keras_dl.data.")]
    assert [m for m in in_data if _layer_of(m, data_layers) is None] == []
    # The hook is a module outside the package, which import-linter cannot take as a root: its
    # contract forbids the layer to import it (its own imports are checked below).
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    hook = config["importlinter:contract:petastorm-hook"]
    assert hook["forbidden_modules"].split() == ["keras_dl_petastorm_hook"]


def test_every_package_but_tracking_is_forbidden_to_import_mlflow():
    # keras_dl.tracking is MLflow's one home (contract tracking-home): a new package or module
    # at the top of keras_dl must be one of the contract's sources, or it could import mlflow.
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    home = config["importlinter:contract:tracking-home"]
    assert home["forbidden_modules"].split() == ["mlflow"]
    top = {
        f"keras_dl.{p.stem}"
        for p in (REPO / "keras_dl").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert set(home["source_modules"].split()) == top - {"keras_dl.tracking"}


@pytest.mark.parametrize("hook", [h.removesuffix(".py") for h in HOOKS])
def test_the_import_hooks_import_only_the_standard_library(hook):
    # -S: no site-packages, so no .pth file loads anything first.
    code = (
        "import sys; before = set(sys.modules); sys.path.insert(0, sys.argv[1]); "
        f"import {hook}; "
        f"print(' '.join(sorted(set(sys.modules) - before - {{'{hook}'}})))"
    )
    out = subprocess.run(
        [REAL_PYTHON, "-S", "-c", code, str(REPO)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in loaded), loaded


def string_import_problems(source: str, module: str, rel: str, used: set | None = None):
    """What is wrong with the loads by string in one module's source (empty when nothing)."""
    used = set() if used is None else used
    problems = []
    for function, call in _string_loads(ast.parse(source)):
        where = f"{rel}:{call.lineno}"
        name, exact = _loaded_name(call.args[0]) if call.args else (None, False)
        if name is not None and (name == "keras_dl" or name.startswith("keras_dl.")):
            problems += [f"{where}: {p}" for p in _layer_problems(module, name)]
            continue
        if name is not None and exact and not name.startswith(ABOVE_KERAS_DL):
            continue  # a third-party module named outright: no arrow inside keras_dl
        if (rel, function) in ALLOWED:
            used.add((rel, function))
            problems += [f"{where}: {p}" for n in _keras_dl_names(source) for p in _layer_problems(module, n)]  # fmt: skip
            continue
        what = name or ast.unparse(call.args[0] if call.args else call)
        problems.append(f"{where}: loads {what!r} by a name lint-imports cannot check")
    return problems


def _string_loads(tree):
    """``(enclosing function, call)`` for each importlib.import_module / __import__ call."""
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))]:
        body = scope.body if scope is not tree else [
            n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)
        ]  # fmt: skip
        for node in (n for stmt in body for n in _walk_no_functions(stmt)):
            if isinstance(node, ast.Call) and _is_load(node.func):
                yield getattr(scope, "name", "<module>"), node


def _walk_no_functions(node):
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _walk_no_functions(child)


def _is_load(func) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


def _loaded_name(arg) -> tuple[str | None, bool]:
    """The module name (or its constant prefix, for an f-string) and whether it is the whole."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, True
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip("."), False
    return None, False


def _keras_dl_names(source: str) -> list[str]:
    """Strings (and f-string prefixes) in the source that name keras_dl modules."""
    names = (_loaded_name(node)[0] for node in ast.walk(ast.parse(source)))
    return [n for n in names if n and re.fullmatch(r"keras_dl(\.\w+)+", n)]


def _layer_problems(importer: str, imported: str) -> list[str]:
    contracts = list(_contracts())
    unplaced = [m for m in (importer, imported) if not any(_layer_of(m, ls) for _, ls in contracts)]
    if unplaced:
        return [f"{importer} loads {imported} by string; {unplaced} in no layer of .importlinter"]
    problems = []
    for contract, layers in contracts:
        a, b = _layer_of(importer, layers), _layer_of(imported, layers)
        if a is None or b is None or a == b:
            continue
        if a[0] > b[0]:
            problems.append(f"{importer} loads {imported} by string, above it in {contract!r}")
        elif a[0] == b[0]:
            problems.append(f"{importer} loads {imported} by string, an independent sibling in {contract!r}")  # fmt: skip
    return problems


def _layer_of(module: str, layers) -> tuple[int, str] | None:
    for index, siblings in enumerate(layers):
        for sibling in siblings:
            if module == sibling or module.startswith(sibling + "."):
                return index, sibling
    return None


def _contracts():
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    for section in config.sections():
        if not section.startswith("importlinter:contract:") or config[section]["type"] != "layers":
            continue
        lines = [line.strip() for line in config[section]["layers"].splitlines() if line.strip()]
        containers = config[section].get("containers", "").split() or [""]
        for container in containers:
            prefix = f"{container}." if container else ""
            layers = [[prefix + s.strip() for s in line.split("|")] for line in lines]
            yield config[section]["name"], layers


def _sources():
    for hook in HOOKS:
        yield REPO / hook
    for root, _, files in os.walk(REPO / "keras_dl"):
        for name in sorted(files):
            if name.endswith(".py"):
                yield REPO / root / name


def _rel(path) -> str:
    return path.relative_to(REPO).as_posix()


def _module_name(path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
