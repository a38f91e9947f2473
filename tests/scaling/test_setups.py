"""--setups: each item parsed to its setup, a bad one refused by name before anything runs, and
np:N (Spark tasks) refused when no Spark master is configured."""

from __future__ import annotations

import pytest

from keras_dl.errors import ConfigError
from keras_dl.scaling.setups import check_spark_master, parse_setups, spark_master


def test_the_setups_are_parsed_in_order():
    setups = parse_setups("1, mirrored:2,np:-2,np:4")
    assert [s.label for s in setups] == ["1", "mirrored:2", "np:-2", "np:4"]
    assert [s.key for s in setups] == ["single", "mirrored_2", "np_local_2", "np_spark_4"]
    assert [s.replicas for s in setups] == [1, 2, 2, 4]
    assert [s.in_process for s in setups] == [True, True, False, False]


def test_multiworker_setups_run_local_workers_through_the_launcher(tmp_path):
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.scaling.setups import setup_experiment

    (setup,) = parse_setups("multiworker:2")
    assert (setup.label, setup.key, setup.replicas, setup.in_process) == (
        "multiworker:2",
        "multiworker_2",
        2,
        False,
    )
    exp = resolve(load_recipe("digits").defaults, sets=[f"runtime.run_dir={tmp_path}"])
    runtime = setup_experiment(exp, setup).runtime
    assert (runtime.strategy, runtime.np) == ("multiworker", -2)


@pytest.mark.parametrize(
    "text, named",
    [
        ("1,gpu:2", "'gpu:2'"),
        ("1,np:0", "'np:0'"),
        ("multiworker:0", "'multiworker:0'"),
        ("mirrored:x", "'mirrored:x'"),
        ("2", "'2'"),
        ("1,,np:-2", "empty item"),
        ("np:-2,np:-2", "'np:-2' twice"),
    ],
)
def test_a_bad_item_is_refused_by_name(text, named):
    with pytest.raises(ConfigError, match=named):
        parse_setups(text)


def test_the_command_refuses_a_bad_item_before_any_run(capsys, tmp_path):
    from keras_dl.cli import main

    code = main(
        ["scaling", "digits", "--setups", "1,gpu:2", "--set", f"runtime.run_dir={tmp_path}"]
    )
    assert code == 2
    assert "--setups item 'gpu:2' is not a setup" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any run folder or store existed


def test_spark_tasks_need_a_configured_master(monkeypatch, tmp_path):
    for name in ("MASTER", "SPARK_REMOTE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no spark-defaults.conf here
    setups = parse_setups("1,np:-2,np:2")
    with pytest.raises(ConfigError, match="'np:2' runs 2 Spark tasks, but no Spark master"):
        check_spark_master(setups, spark_master(None))
    check_spark_master(parse_setups("1,np:-2"), spark_master(None))  # local ranks need none
    (tmp_path / "spark-defaults.conf").write_text("spark.master  spark://10.0.0.5:7077\n")
    assert spark_master(None) == "spark://10.0.0.5:7077"
    check_spark_master(setups, spark_master(None))
