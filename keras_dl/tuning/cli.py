"""Search a recipe's hyperparameters with Optuna: keras-dl tune RECIPE --space KEY=KIND(ARGS) ...

Examples::

    keras-dl tune digits --trials 8 --parallelism 2 \\
        --space train.learning_rate=loguniform(1e-4,1e-1) --space model.dense=choice(64,128)
    keras-dl tune digits --space-file space.yaml --set train.epochs=5

KIND is uniform(LOW,HIGH), loguniform(LOW,HIGH), int(LOW,HIGH), logint(LOW,HIGH) or
choice(A,B,...); a choice is written as --set takes it (choice([64,32],[128,64]) for a list).
Rerunning the same command after a kill resumes the study: finished trials are not rerun.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="a module under recipes/, or your own (mypkg.recipes.churn)")
    p.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="SECTION.KEY=KIND(ARGS)",
        help="one searched setting (repeatable), e.g. train.learning_rate=loguniform(1e-4,1e-1)",
    )
    p.add_argument("--space-file", help="YAML file of {section.key: KIND(ARGS)}")
    p.add_argument("--trials", type=int, help="trials in all (tune.trials)")
    p.add_argument("--parallelism", type=int, help="trials at a time (tune.parallelism)")


def run(args: argparse.Namespace) -> int:
    from keras_dl.config import resolve
    from keras_dl.errors import NotRegistered
    from keras_dl.recipe import load_recipe
    from keras_dl.tracking import ui_command
    from keras_dl.tuning.space import parse_space, read_space
    from keras_dl.tuning.study import tune

    sets = list(args.sets)
    if args.trials is not None:
        sets.append(f"tune.trials={args.trials}")
    if args.parallelism is not None:
        sets.append(f"tune.parallelism={args.parallelism}")
    exp = resolve(load_recipe(args.recipe).defaults, args.config, sets)
    space = (read_space(args.space_file) if args.space_file else []) + parse_space(args.space)
    result = tune(exp, space)
    print(f"study {result.study} ({result.storage}), parent run {result.parent_run_id}")
    for row in result.trials:
        params = " ".join(f"{k[6:]}={_short(v)}" for k, v in row.items() if k.startswith("param."))
        value = "" if row["value"] is None else f"{row['value']:.4f}"
        print(f"  trial {row['number']:3d} {row['state']:9s} {value:>8s} {params}")
    if result.best_trial is not None:
        best = " ".join(f"{k}={_short(v)}" for k, v in result.best_params.items())
        print(f"best trial {result.best_trial}: {result.best_value:.4f} {best}")
    if result.registered_version is not None:
        print(
            f"registered model: models:/{exp.tracking.registered_model}/{result.registered_version}"
        )
    print(f"MLflow UI: {ui_command(exp.tracking.uri)}")
    if result.not_registered:
        raise NotRegistered(f"The best trial's model was {result.not_registered}.")
    return 0


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
