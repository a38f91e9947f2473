"""`keras-dl bench tabular`: the tabular recipe beside scikit-learn. On a cut-down setting (iris,
3 epochs, 2 seeds): the printed table's shape, and that its numbers are real (the scikit-learn
score of keras_dl's model is the run's own test metric, the baselines are fit), and that the exit
status is the verdict. With the recipe's defaults on small tables (``--quick``): every target
met, or the test fails. Timings are not asserted."""

import json

import pytest

from benchmarks.tabular import COLUMNS
from tests.conftest import STARTS_FIRST, cli_in_process, run_cli


@pytest.mark.slow
def test_bench_tabular_prints_one_row_per_dataset_with_real_scores(tmp_path):
    out, cfg = tmp_path / "tabular.json", tmp_path / "recipe.yaml"
    cfg.write_text("train:\n  epochs: 9\n")  # the recipe's settings, as `keras-dl train` takes them
    args = ("--datasets", "iris", "--seeds", "2", "--config", str(cfg), "--set", "train.epochs=3")
    args += ("--out", str(out))
    done = run_cli("bench", "tabular", *args, cwd=tmp_path, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("dataset "))
    assert lines[header].split("  ")[0] == "dataset" and all(c in lines[header] for c in COLUMNS)
    row = lines[header + 1]
    assert row.startswith("iris ") and lines[header + 2].startswith("keras_dl: ")
    cells = [c.strip() for c in row.split("  ") if c.strip()]
    # One cell per column; scores carry [min, max] spreads of the two seeds.
    assert len(cells) == len(COLUMNS), cells
    values = dict(zip(COLUMNS, cells))
    assert values["rows tr/va/te"] == "90/30/30" and values["metric"] == "accuracy"
    assert values["result"] in ("PASS", "MISS") and values["target"] == ">= -0.02"
    # A miss exits 1 and says so: a script (or CI) running the benchmark sees it.
    assert (done.returncode == 0) == (values["result"] == "PASS"), done.stderr[-2000:]
    assert (values["result"] == "MISS") == ("MISS: keras_dl missed" in done.stderr)
    assert values["batch"] == "8" and values["epochs"] == "3/3"  # chosen batch; --set wins
    assert values["keras_dl"].endswith("]") and ", " in values["keras_dl"]

    report = json.loads(out.read_text())
    (iris,) = report["datasets"]
    assert report["seeds"] == 2 and len(iris["runs"]) == 2
    assert values["keras_dl"].startswith(f"{iris['keras_dl']['median']:.3f} [")
    for run in iris["runs"]:
        # scikit-learn's accuracy of the model's predictions is the run's own test_accuracy.
        assert run["keras_dl"] == pytest.approx(run["keras_dl_own_test_metric"], abs=1e-6)
        assert 0.0 <= run["keras_dl"] <= 1.0 and run["keras_dl_cpu_s"] > 0
        assert run["linear"] >= 0.8 and run["hgb"] >= 0.8  # fit, not a constant
        assert run["epochs_run"] == 3 and run["batch_size"] == 8
    best = max(iris["runs"][0]["linear"], iris["runs"][0]["hgb"])
    assert iris["runs"][0]["keras_dl"] - best in (iris["gap"]["min"], iris["gap"]["max"])


@STARTS_FIRST
@pytest.mark.slow
def test_bench_tabular_defaults_meet_every_target_on_small_tables(tmp_path):
    """The recipe with no settings, beside LogisticRegression/Ridge and HistGradientBoosting on
    the same split: within 0.04 accuracy (0.02 on iris) or 1.05x RMSE, or this test fails."""
    out = tmp_path / "tabular.json"
    tables = "iris,tiny,strings,missing,regression"
    args = ("--datasets", tables, "--quick", "--seeds", "1", "--out", str(out))
    done = run_cli("bench", "tabular", *args, cwd=tmp_path, timeout=1200)
    report = json.loads(out.read_text())
    verdicts = {r["dataset"]: (r["passed"], r["gap"]["median"]) for r in report["datasets"]}
    assert done.returncode == 0 and all(p for p, _ in verdicts.values()), (
        verdicts,
        done.stdout[-3000:],
    )
    assert list(verdicts) == tables.split(",") and report["quick"] is True
    rows = {r["dataset"]: r["rows"]["train"] for r in report["datasets"]}
    assert rows["tiny"] == 60 and rows["strings"] == 240  # --quick: at most 400 rows a table


def test_bench_tabular_refuses_an_unknown_dataset():
    done = cli_in_process("bench", "tabular", "--datasets", "iris,wine")
    assert done.returncode == 2
    assert "--datasets 'iris,wine'" in done.stderr and "iris, diabetes, digits" in done.stderr
