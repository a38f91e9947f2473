"""``keras-dl``: train, tune, scaling, ingest, recipes (and the entry behind ``python -m recipes.NAME``).

Errors a user can fix (:class:`~keras_dl.errors.KerasDLError`) print as one paragraph and exit
with their ``exit_code``: 2, 3 when training diverged, 4 when the model did not earn
registration, 75 when preempted or the object store stayed unreachable (rerun to resume);
nothing else is swallowed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from keras_dl.errors import KerasDLError, NotRegistered

EXIT_USER_ERROR = 2
# The folder keras_dl was imported from sits in: a source checkout (with benchmarks/) or
# site-packages.
_ROOT = Path(__file__).resolve().parent.parent


def _for_stderr(text: str) -> str:
    """An error for a person at a terminal, wrapped at 100 columns without breaking a path or a
    key; unwrapped when stderr is a file or a pipe (logs, CI, tests), where a line break could
    fall inside the words someone searches for."""
    if not sys.stderr.isatty():
        return text
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``keras-dl`` command line; return the exit status."""
    _quiet_libraries()
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return args.func(args) or 0
    except KerasDLError as exc:
        print(f"error: {_for_stderr(str(exc))}", file=sys.stderr)
        return exc.exit_code  # 2; 3 diverged; 4 not registered; 75 preempted
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def run_recipe(name: str, argv: Sequence[str] | None = None) -> int:
    """``python -m recipes.NAME [--config F] [--set K=V ...]``: train that recipe."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return main(["train", name, *argv])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="keras-dl", description="Keras 3 training on Delta/Parquet tables, tracked in MLflow."
    )
    sub = p.add_subparsers(dest="command")

    t = sub.add_parser("train", help="train a recipe (see `keras-dl recipes`)")
    t.add_argument("recipe", help="a module under recipes/, or your own (mypkg.recipes.churn)")
    _add_config_args(t)
    t.set_defaults(func=_cmd_train)

    r = sub.add_parser("recipes", help="list the recipes with their defaults")
    r.set_defaults(func=_cmd_recipes)

    i = sub.add_parser("ingest", help="write a dataset into a Delta table")
    isub = i.add_subparsers(dest="source")
    d = isub.add_parser("sklearn-digits", help="scikit-learn's bundled 8x8 digits (1,797 images)")
    _add_ingest_args(d, rows_per_group=128)
    d.set_defaults(func=_cmd_ingest_digits)
    from keras_dl.data.ingest import images, mds, tfds

    for name, module in (("tfds", tfds), ("images", images), ("mds", mds)):
        _add_module_command(isub, name, module, _add_ingest_args)  # each owns its arguments

    _add_bench_commands(sub)

    from keras_dl import inference as predict
    from keras_dl.erasure import cli as erasure
    from keras_dl.lineage import cli as lineage
    from keras_dl.model import registry
    from keras_dl.report import build as report
    from keras_dl.scaling import cli as scaling
    from keras_dl.tuning import cli as tune

    # It searches a recipe's settings: the fixed ones come as in `train` (--config, --set).
    _add_module_command(sub, "tune", tune, lambda p, **_: _add_config_args(p))
    # It trains a recipe on several setups: its settings come as in `train` (--config, --set).
    _add_module_command(sub, "scaling", scaling, lambda p, **_: _add_config_args(p))
    _add_module_command(sub, "predict", predict)
    _add_module_command(sub, "promote", registry)
    _add_module_command(sub, "report", report)
    _add_module_command(sub, "lineage", lineage)
    _add_module_command(sub, "retrain-without", erasure)
    return p


def _add_bench_commands(sub) -> None:
    """``keras-dl bench ...``: the benchmarks of the source checkout keras_dl runs from.

    They are not in the wheel (setup.cfg ``packages.find``): without a checkout, ``keras-dl
    bench`` says how to get them, and every other command works as before.
    """
    b = sub.add_parser(
        "bench", help="benchmarks (a source checkout): each figure beside its baseline"
    )
    bench_cli, why = _checkout_benchmarks()
    if bench_cli is None:
        b.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        b.set_defaults(func=lambda args: _raise(KerasDLError(why)))
        return
    bench_cli.add_commands(b.add_subparsers(dest="bench"), _add_module_command, _add_config_args)


def _add_module_command(sub, name: str, mod, common=None) -> None:
    """A sub-command implemented by ``mod.add_arguments(parser)`` and ``mod.run(args)``.

    Such modules are imported to build the parser, so they must import TensorFlow, Spark and
    other heavy packages inside their functions, not at module level.
    """
    help_text = (mod.__doc__ or name).strip().splitlines()[0]
    p = sub.add_parser(name, help=help_text, description=mod.__doc__)
    if common is not None:
        common(p, rows_per_group=getattr(mod, "ROWS_PER_GROUP", 1024))
    mod.add_arguments(p)
    p.set_defaults(func=mod.run)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of {section: {key: value}} overrides")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set train.epochs=5",
    )


def _add_ingest_args(p: argparse.ArgumentParser, rows_per_group: int) -> None:
    p.add_argument("--to", required=True, help="Delta table path or URI to write")
    p.add_argument(
        "--mode",
        default="error",
        choices=["error", "append", "overwrite", "ignore"],
        help="what to do when the table exists (default: error)",
    )
    p.add_argument(
        "--rows-per-group",
        type=int,
        default=rows_per_group,
        help=f"rows per Parquet row group (default: {rows_per_group})",
    )


def _cmd_train(args) -> int:
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    exp = resolve(recipe.defaults, args.config, args.sets)
    if exp.runtime.launches and exp.runtime.np > 0:  # before a run
        from keras_dl.extras import import_extra

        import_extra(
            "pyspark",
            f"runtime.np={exp.runtime.np} (Horovod ranks or multi-worker workers as Spark tasks)",
        )
    from keras_dl import tracking
    from keras_dl.storage import watchdog
    from keras_dl.train import fit

    watchdog.install()  # a store call hung past the run's lease ends this process: 75, KILLED
    if exp.runtime.launches:
        from keras_dl.launch import launch

        result = launch(exp)  # HorovodRunner semantics: np < 0 local processes, np > 0 Spark tasks
    else:
        result = fit(exp, recipe)
    if result.run_id:
        print(f"run id: {result.run_id}")
        for k, v in sorted(result.metrics.items()):
            print(f"{k}: {v:.4f}")
        if result.registered_version is not None:
            name = exp.tracking.registered_model
            print(f"registered model: models:/{name}/{result.registered_version}")
        print(f"MLflow UI: {tracking.ui_command(exp.tracking.uri)}")
    if result.not_registered:
        raise NotRegistered(
            f"The model was {result.not_registered}. Run {result.run_id} ended FINISHED with "
            f"this as its {tracking.NOT_REGISTERED_TAG} tag, and its model is logged. Train a "
            "better one (other train.* settings; --set runtime.resume=false starts over), or "
            "change registry.min_metric or registry.must_beat and run the same command again: "
            "it trains nothing and decides again."
        )
    return 0


def _cmd_recipes(args) -> int:
    from keras_dl.recipe import list_recipes, load_recipe

    for name in list_recipes():
        r = load_recipe(name)
        d = r.defaults
        print(f"{name:10s} {r.description}")
        print(
            f"{'':10s} defaults: epochs={_auto(d.train.epochs)} "
            f"batch_size={_auto(d.train.batch_size)} "
            f"learning_rate={d.train.learning_rate} optimizer={d.train.optimizer} "
            f"table={d.data.table or '-'}"
        )
        if d.model is not None:  # the recipe's own section, e.g. its backbone
            import dataclasses

            model = " ".join(f"{k}={v}" for k, v in dataclasses.asdict(d.model).items())
            print(f"{'':10s} model: {model}")
    return 0


def _auto(value) -> str:
    """A setting the recipe chooses from the table (null in its defaults) reads "auto"."""
    return "auto" if value is None else str(value)


def _cmd_ingest_digits(args) -> int:
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits

    report = ingest_sklearn_digits(args.to, mode=args.mode, rows_per_group=args.rows_per_group)
    print(report)
    return 0


def _checkout_benchmarks():
    """``(benchmarks.cli, None)`` of the checkout beside the keras_dl package imported, or
    ``(None, why)`` when there is none (an installed wheel) or another ``benchmarks`` shadows it.

    The benchmarks import each other as the top-level package ``benchmarks``: the checkout's
    folder goes first on ``sys.path`` so that no other package of that name is taken for them.
    """
    if not ((_ROOT / "setup.cfg").is_file() and (_ROOT / "benchmarks" / "cli.py").is_file()):
        return None, (
            "keras-dl bench runs the benchmarks of a keras-dl source checkout (its benchmarks/ "
            f"folder, which the wheel does not ship), and keras_dl was imported from {_ROOT}, "
            "which has none. In a clone of the repository, pip install -e '.[cpu,bench]' "
            "(editable, so that keras_dl runs from the checkout beside its benchmarks), or run "
            "this command with PYTHONPATH set to the checkout."
        )
    if str(_ROOT) not in sys.path:
        sys.path.insert(0, str(_ROOT))
    import importlib

    bench_cli = importlib.import_module("benchmarks.cli")
    found = Path(bench_cli.__file__).resolve().parent
    if found != _ROOT / "benchmarks":
        return None, (
            f"keras-dl bench runs the benchmarks in {_ROOT / 'benchmarks'}, but another package "
            f"named benchmarks ({found}) was imported in its place. Put {_ROOT} first on "
            "PYTHONPATH, or rename that package."
        )
    return bench_cli, None


def _raise(exc: Exception):
    raise exc


def _quiet_libraries() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")


if __name__ == "__main__":
    raise SystemExit(main())
