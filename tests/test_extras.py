"""A core install and its extras: setup.cfg's extras bring what keras_dl.extras names, the core
imports none of them at module level, and each part that needs one says which extra to install.

A missing package is a ``None`` in ``sys.modules`` (what Python itself reads as "not
importable"), for the one test; the real install without them is tests/test_install.py.
"""

from __future__ import annotations

import ast
import configparser
import functools
import importlib
import importlib.metadata
import pickle
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from keras_dl.errors import KerasDLError
from keras_dl.extras import EXTRAS, MissingExtra, import_extra
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parent.parent
# Imported only inside the functions that need them (Horovod is built by a script, not an extra).
OPTIONAL = {*EXTRAS, "horovod"}
# The package that is Spark ML through and through: its __init__ names the extra first.
GUARDED_PACKAGES = ("keras_dl/spark/",)


@functools.cache
def _installed() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions that provide it (seconds to scan)."""
    return importlib.metadata.packages_distributions()


def _options() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _names(lines: str) -> set[str]:
    return {canonicalize_name(Requirement(x).name) for x in lines.split("\n") if x.strip()}


def _without(monkeypatch, top: str) -> None:
    """Make ``top`` and everything under it unimportable for this test."""
    for name in [n for n in sys.modules if n == top or n.startswith(f"{top}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, top, None)


def test_each_optional_package_comes_with_the_extra_its_error_names():
    extras = _options()["options.extras_require"]
    installed = _installed()
    for top, (extra, _) in EXTRAS.items():
        assert extra in extras, f"keras_dl.extras names [{extra}] for {top}; setup.cfg has none"
        # make setup installs every extra: the module must be there, from a listed package
        dists = {canonicalize_name(d) for d in installed.get(top, ())}
        assert dists & _names(extras[extra]), (top, extra, dists, extras[extra])


def test_the_core_requires_none_of_the_optional_packages():
    installed = _installed()
    optional = {canonicalize_name(d) for top in OPTIONAL for d in installed.get(top, ())}
    optional |= {"pyspark", "horovod", "tensorflow", "tensorflow-cpu"}
    core = _names(_options()["options"]["install_requires"])
    assert not core & optional, core & optional


def test_the_wheel_ships_the_package_and_recipes_but_not_the_benchmarks():
    include = _options()["options.packages.find"]["include"].split()
    assert {"keras_dl", "keras_dl.*", "recipes"} <= set(include)
    assert not [p for p in include if p.split(".")[0] == "benchmarks"], include


def test_optional_packages_are_imported_inside_functions_only():
    """At module level an optional import fails a core install's import of keras_dl (or of the
    CLI, which imports every command's module to build its parser)."""
    found = []
    for path in sorted((ROOT / "keras_dl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(GUARDED_PACKAGES):
            continue
        for node in _module_level_imports(ast.parse(path.read_text(), rel)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            found += [
                f"{rel}:{node.lineno} {n}" for n in names if n and n.split(".")[0] in OPTIONAL
            ]
    assert not found, "imported at module level:\n" + "\n".join(found)


def test_the_guarded_package_names_its_extra_before_importing_it(monkeypatch):
    _without(monkeypatch, "pyspark")
    for name in [
        n for n in sys.modules if n == "keras_dl.spark" or n.startswith("keras_dl.spark.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtra, match=r"keras_dl\.spark .*pip install 'keras-dl\[spark\]'"):
        importlib.import_module("keras_dl.spark")


def test_import_extra_says_what_needs_which_package_and_the_pip_line(monkeypatch):
    _without(monkeypatch, "optuna")
    with pytest.raises(MissingExtra) as info:
        import_extra("optuna", "keras-dl tune")
    text = str(info.value)
    assert text.startswith("keras-dl tune needs Optuna, which is not installed"), text
    assert "pip install 'keras-dl[tune]' (from a source checkout: pip install '.[tune]')" in text
    # what callers catch: an ImportError, and the CLI's one-paragraph error (exit 2)
    assert isinstance(info.value, ImportError) and isinstance(info.value, KerasDLError)


@pytest.mark.parametrize(
    "missing, args, extra",
    [
        ("optuna", ["tune", "digits", "--space", "train.learning_rate=loguniform(1e-4,1e-2)"], "tune"),
        (
            "pyspark",
            ["tune", "digits", "--trials", "2", "--parallelism", "2", "--space",
             "train.learning_rate=loguniform(1e-4,1e-2)"],
            "spark",
        ),
        ("pyspark", ["train", "digits", "--set", "runtime.strategy=horovod", "--set", "runtime.np=2"], "spark"),
        ("pyspark", ["scaling", "digits", "--setups", "1,np:2"], "spark"),
        ("pyspark", ["predict", "--model", "models:/digits/1", "--table", "T", "--out", "OUT"], "spark"),
    ],
    ids=["tune", "tune-parallel", "train-spark-ranks", "scaling-spark-ranks", "predict"],
)  # fmt: skip
def test_each_command_names_the_extra_it_needs_before_it_starts(
    monkeypatch, tmp_path, missing, args, extra
):
    _without(monkeypatch, missing)
    sets = ["--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "--set", f"runtime.run_dir={tmp_path / 'run'}"]  # fmt: skip
    proc = cli_in_process(*args, *([] if args[0] == "predict" else sets), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"pip install 'keras-dl[{extra}]'" in proc.stderr, proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()


def test_live_figures_name_the_monitoring_extra(monkeypatch):
    from keras_dl.callbacks.prometheus_export import RunMetrics

    _without(monkeypatch, "prometheus_client")
    with pytest.raises(MissingExtra, match=r"prometheus_port.*keras-dl\[monitoring\]"):
        RunMetrics("run", "digits")


def test_an_abfs_run_directory_names_the_azure_extra(monkeypatch):
    from keras_dl.runlock.azure_lease import AzureLease

    _without(monkeypatch, "azure")
    with pytest.raises(MissingExtra, match=r"abfs:// run directory.*keras-dl\[azure\]"):
        AzureLease("abfss://runs@account.dfs.core.windows.net/digits")


def test_an_s3_run_directory_names_the_s3_extra(monkeypatch):
    from keras_dl.runlock.s3_lease import s3_client

    _without(monkeypatch, "boto3")
    with pytest.raises(MissingExtra, match=r"run directory on S3.*keras-dl\[s3\]"):
        s3_client()


def test_a_petastorm_dataset_names_the_extra_its_schema_needs(monkeypatch):
    """ScalarCodec pickles a Spark SQL type (PySpark: [spark]); CompressedImageCodec decodes with
    OpenCV ([images]), which Petastorm only notices in a reader thread (``cv2`` undefined)."""
    import numpy as np
    import petastorm.codecs
    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType

    from keras_dl.data.tables.petastorm_meta import loads_unischema

    image = UnischemaField("image", np.uint8, (4, 4, 3), CompressedImageCodec("png"), False)
    label = UnischemaField("label", np.int64, (), ScalarCodec(LongType()), False)
    vec = UnischemaField("vec", np.float32, (3,), NdarrayCodec(), False)
    with_label = pickle.dumps(Unischema("S", [label, vec]))
    with_image = pickle.dumps(Unischema("I", [image, vec]))
    assert loads_unischema(with_image, "/data/images").fields.keys() == {"image", "vec"}

    with monkeypatch.context() as m:
        m.setattr(petastorm.codecs, "OPENCV_AVAILABLE", False)  # what Petastorm sets without cv2
        with pytest.raises(
            MissingExtra, match=r"'/data/images' \(field 'image' .*keras-dl\[images\]"
        ):
            loads_unischema(with_image, "/data/images")
    _without(monkeypatch, "pyspark")
    with pytest.raises(MissingExtra, match=r"'/data/labels' .*pyspark.*keras-dl\[spark\]"):
        loads_unischema(with_label, "/data/labels")


def test_the_recipes_examples_need_no_opencv(monkeypatch, tmp_path):
    """keras_dl's own image path (keras-dl ingest images, the flowers recipe) is tf.data's."""
    from recipes import _examples

    _without(monkeypatch, "cv2")
    table, _ = _examples.flowers(str(tmp_path), per_class=2)
    from keras_dl.data import read_table

    assert read_table(table, columns=["label"]).num_rows == 4


def test_bench_without_a_checkout_says_where_the_benchmarks_are(monkeypatch, tmp_path):
    from keras_dl import cli

    monkeypatch.setattr(cli, "_ROOT", tmp_path)  # site-packages: no setup.cfg, no benchmarks/
    proc = cli_in_process("bench", "input", "--rows", "10")
    assert proc.returncode == 2, proc.stderr
    assert "source checkout" in proc.stderr and str(tmp_path) in proc.stderr
    assert "pip install -e '.[cpu,bench]'" in proc.stderr


def _module_level_imports(tree: ast.Module):
    """The imports a module runs when imported: its body and its classes', not its functions'
    nor what ``if TYPE_CHECKING:`` guards."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]


def test_launch_on_spark_tasks_from_python_names_the_spark_extra(monkeypatch, tmp_path):
    """A notebook's ``launch(exp)`` with runtime.np=2 and no PySpark: was a bare
    ModuleNotFoundError from deep in the Spark start, after the recipe's checks read the table."""
    from keras_dl.config import resolve
    from keras_dl.launch import launch
    from keras_dl.recipe import load_recipe

    _without(monkeypatch, "pyspark")
    exp = resolve(
        load_recipe("digits").defaults,
        sets=[
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"runtime.run_dir={tmp_path / 'run'}",
            f"data.table={tmp_path / 'no-table'}",
            "runtime.np=2",
            "runtime.strategy=horovod",
        ],
    )
    with pytest.raises(MissingExtra) as info:
        launch(exp)
    text = str(info.value)
    assert text.startswith("runtime.np=2 (one rank per Spark task) needs PySpark"), text
    assert "pip install 'keras-dl[spark]'" in text
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()
