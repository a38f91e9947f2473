"""A runtime.np this host or cluster cannot run is refused by name before any rank starts."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest

from keras_dl.distribute import np_check
from keras_dl.distribute.np_check import (
    check_local_np,
    measure_rank_footprint,
    read_available_memory,
    refuse_local_np,
)
from keras_dl.errors import DistributedError

_GIB = 1024**3


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A footprint cache of this module's own: the first test measures, the others read it."""
    return tmp_path_factory.mktemp("footprint") / "rank-footprint.json"


def test_the_rank_footprint_is_measured_in_a_fresh_interpreter_and_cached(cache):
    footprint = measure_rank_footprint(cache)
    bare = measure_rank_footprint(cache, modules=("json",))
    # TensorFlow, Keras and keras_dl's training stack weigh hundreds of MB; a bare Python does not.
    assert footprint > bare + 100 * 2**20, (footprint, bare)
    records = json.loads(cache.read_text())
    assert sorted(r["bytes"] for r in records.values()) == sorted([footprint, bare])
    (key,) = [k for k, r in records.items() if r["modules"] == list(np_check.RANK_MODULES)]
    assert "tensorflow" in key and sys.executable in key  # per environment
    assert measure_rank_footprint(cache) == footprint  # read back, not measured again


def test_np_minus_99_is_refused_with_the_figures(cache):
    footprint = measure_rank_footprint(cache)
    available = read_available_memory()
    fits = available // footprint
    # Twice as many ranks as fit is refused on any host (MemAvailable moves between reads);
    # np=-99 on this one (2 cores, ~23 GB available, 0.6 GB a rank).
    for ranks in sorted({2 * fits + 2, 99}):
        if ranks * footprint <= available:
            check_local_np(-ranks, cache)  # a host with that much memory runs them
            continue
        with pytest.raises(DistributedError) as caught:
            check_local_np(-ranks, cache)
        text = str(caught.value)
        assert text.startswith(f"runtime.np=-{ranks} starts {ranks} Horovod ranks on this host")
        assert f"at least {footprint / _GIB:.2f} GiB" in text
        assert f"{ranks * footprint / _GIB:.2f} GiB in all" in text
        assert "available (MemAvailable in /proc/meminfo)" in text
        use = re.search(r"Use at most (\d+) local ranks \(runtime\.np=-\1\)", text)
        assert use and abs(int(use.group(1)) - fits) <= max(1, fits // 10), text


def test_np_minus_2_passes(cache):
    check_local_np(-2, cache)
    check_local_np(2, cache)  # Spark tasks: the cluster's slots decide (slots.py)


def test_more_ranks_than_cores_are_allowed_with_one_line(cache, caplog):
    ranks = len(os.sched_getaffinity(0)) + 1
    np_check._said.clear()
    with caplog.at_level(logging.WARNING, logger="keras_dl.distribute.np_check"):
        check_local_np(-ranks, cache)
        check_local_np(-ranks, cache)  # launch, then its HorovodRunner: said once
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"runtime.np=-{ranks} runs {ranks} Horovod ranks" in lines[0]
    assert "share the cores (allowed" in lines[0]


def test_more_ranks_than_gpus_are_refused_when_tensorflow_uses_gpus():
    figures = {"footprint": _GIB, "available": 64 * _GIB, "cores": 16}
    with pytest.raises(DistributedError, match=r"runtime.np=-4 .* TensorFlow sees 2 GPU\(s\) here"):
        refuse_local_np(4, gpus=2, **figures)
    refuse_local_np(2, gpus=2, **figures)
    refuse_local_np(4, gpus=0, **figures)  # CPU ranks: memory and cores decide


def test_a_refused_np_creates_no_run_and_starts_nothing(digits_exp, tmp_path):
    from keras_dl.launch import launch

    exp = digits_exp("runtime.strategy=horovod", "runtime.np=-99999")
    with pytest.raises(DistributedError, match=r"runtime.np=-99999 starts 99999 Horovod ranks"):
        launch(exp)
    # Refused before the driver opened the run: no store, no run folder.
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()


def test_horovod_runner_refuses_it_before_starting_a_rank(cache):
    from keras_dl.launch import HorovodRunner

    with pytest.raises(DistributedError, match=r"runtime.np=-99999 starts 99999 Horovod ranks"):
        HorovodRunner(np=-99999).run(print)


@pytest.mark.parametrize("strategy", ["horovod", "multiworker"])
def test_fit_called_outside_a_launch_with_np_is_told_to_launch(digits_exp, tmp_path, strategy):
    """A notebook's fit(exp) with runtime.np=-2 trained alone under Horovod (one rank, no
    word of the other): the ranks were never started."""
    from keras_dl.errors import ConfigError
    from keras_dl.train import fit

    exp = digits_exp(f"runtime.strategy={strategy}", "runtime.np=-2")
    with pytest.raises(ConfigError, match=r"keras_dl\.launch\.launch\(exp\)"):
        fit(exp)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()
