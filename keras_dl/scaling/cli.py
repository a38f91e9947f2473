"""Train a recipe on several cluster setups and compare them: keras-dl scaling RECIPE --setups ...

Examples::

    keras-dl scaling digits --setups 1,np:-2 --set data.table=data/digits
    keras-dl scaling digits --setups 1,mirrored:2,np:-2,np:4 --set train.epochs=20

SETUPS is a comma list of 1 (one device), mirrored:N (MirroredStrategy over N devices: GPUs, or
logical CPU devices on a host without one) and np:N (Horovod, as HorovodRunner's np: N < 0 local
ranks, N > 0 Spark tasks, which need a Spark master). Each trains the same recipe with the same
early-stopping thresholds as a child of one parent MLflow run; the page comparing them
(scaling.html) is logged to the parent and written to --out.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="a module under recipes/, or your own (mypkg.recipes.churn)")
    p.add_argument(
        "--setups",
        required=True,
        help="comma list of 1, mirrored:N and np:N, e.g. 1,mirrored:2,np:-2",
    )
    p.add_argument(
        "--out",
        help="where to write the page (default: <runtime.run_dir>/scaling/scaling.html, or a "
        "temporary folder when runtime.run_dir is not local)",
    )


def run(args: argparse.Namespace) -> int:
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.report.scaling import efficiency
    from keras_dl.scaling.setups import parse_setups
    from keras_dl.scaling.study import run_study
    from keras_dl.tracking import ui_command

    setups = parse_setups(args.setups)  # a bad item is refused before anything starts
    exp = resolve(load_recipe(args.recipe).defaults, args.config, args.sets)
    out = args.out
    if out is None and "://" not in exp.runtime.run_dir:
        out = f"{exp.runtime.run_dir.rstrip('/')}/scaling/scaling.html"
    result = run_study(exp, setups, out)
    print(f"scaling study of {exp.recipe}: parent run {result.parent_run_id}")
    print(
        f"  {'setup':12s} {'replicas':>8s} {'epochs':>6s} {'seconds':>8s} {'val_loss':>9s} "
        f"{'samples/s/replica':>17s} {'efficiency':>10s}"
    )
    base = next((f for f in result.figures if f.label == "1"), None)
    for f in result.figures:
        print(
            f"  {f.label:12s} {f.replicas:8d} {f.epochs:6d} {_num(f.seconds, '.1f'):>8s} "
            f"{_num(f.val_loss, '.4f'):>9s} {_num(f.per_replica, '.0f'):>17s} "
            f"{_num(efficiency(f, base), '.2f'):>10s}"
        )
    print(f"page: {result.page_path} (logged to run {result.parent_run_id} as scaling.html)")
    print(f"MLflow UI: {ui_command(exp.tracking.uri)}")
    return 0


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
