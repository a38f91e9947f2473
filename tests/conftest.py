"""Shared fixtures: real Delta tables on disk, a real SQLite-backed MLflow in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import mlflow_template
from tests.mlflow_template import seed_store  # noqa: F401  (the tests import it from here)

# Keras' scikit-learn and matplotlib extras load on first use in this process (once keras_dl is
# imported) and in every subprocess (keras_dl_petastorm_compat.pth): about 1.7 CPU-s saved per
# process that imports Keras. The hook is opt-in; users' processes import Keras as it ships.
os.environ.setdefault("KERAS_DL_DEFER_KERAS_EXTRAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every JVM the tests start (each session's local Spark, the standalone cluster's daemons and
# executors, Connect servers, the CLI's Spark drivers) compiles with C1 only (the data are tiny
# and the JVMs short-lived: C2 never pays for itself; about 35 % less CPU to start a session and
# run a few jobs) and collects with the serial collector (fewer pages touched, a lower peak RSS).
# Users' JVMs keep Java's defaults.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# TensorFlow's op kernels, and the BLAS/OpenMP pools under numpy, scikit-learn and oneDNN, run on
# one thread in every test process: on 2 cores shared by 4 workers, more threads only spin and
# wait for each other (a digits fit took 5-14 % less CPU with TF_NUM_INTRAOP_THREADS=1, measured
# here). It also makes float reductions the same run to run. Users' processes keep the defaults.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Horovod's background loop negotiates every HOROVOD_CYCLE_TIME ms (1 by default), and on Gloo an
# idle rank spins at it: a rank waiting 10 s for its peer used 1.3-5.6 CPU-s at the default and
# 0.2 at 5 ms, Horovod's default before 0.21 (measured with horovodrun). Each allreduce waits at
# most one cycle more. Local ranks get it since keras_dl.launch.rank undoes Horovod 0.28.1's
# "(None,)" over it (before that, they spun at a 0 ms cycle). Users' jobs keep Horovod's default.
os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")
REPO = Path(__file__).resolve().parent.parent
# The fixtures of their own modules: the Spark sessions (classic and Connect), moto's S3 and
# Azurite (Azure Storage's emulator) with a fresh bucket or container, hosts on this machine
# (network, UTS and mount namespaces) and a Spark cluster across them.
pytest_plugins = [
    "tests.fixtures.spark_sessions",
    "tests.fixtures.s3",
    "tests.azurite",
    "tests.fixtures.hosts",
    "tests.fixtures.cluster",
]


def _xdist_controller(config) -> bool:
    """Whether this process is the controller of an xdist run: it runs no test itself."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config):
    """Each process that runs tests forks its Python subprocesses from a warm interpreter
    (tests/warm_python.py: about 5 CPU-s of imports saved per process); the xdist controller,
    which runs none, does not."""
    if _xdist_controller(config):
        return
    from tests import warm_python

    config._warm_python = warm_python.start()


def pytest_unconfigure(config):
    from tests import warm_python

    warm_python.stop(getattr(config, "_warm_python", None))


# The tests that must not share the machine with one another: multi-process Horovod jobs (Gloo
# rendezvous and runtime.stall_timeout), kill -9 / SIGTERM recovery, and loose time bounds. Under
# `pytest -n N --dist loadgroup` (make test) they all run on one xdist worker, one at a time,
# while the other workers run the rest of the suite.
HEAVY = pytest.mark.xdist_group("heavy")
# Single-process kill -9 / signal / store-outage recovery runs: one at a time too, but on their own
# worker beside the Horovod jobs, so the two serial queues do not add up into one critical path.
HEAVY_IO = pytest.mark.xdist_group("heavy_io")
# Horovod jobs on the standalone loopback Spark cluster (a master and two 1-core workers): one at a
# time, on a worker of their own beside the local Horovod jobs. Their cluster's two task slots are
# theirs alone, and most of their time is spent waiting on JVMs and barrier stages.
SPARK_CLUSTER = pytest.mark.xdist_group("spark_cluster")
# Jobs on a cluster of hosts built from network namespaces (tests/fixtures/hosts.py): their own
# Spark master, workers and services on their own addresses, so they take none of the loopback
# cluster's slots; one at a time, on a worker of their own.
HOSTS = pytest.mark.xdist_group("hosts")
# Their hang guard: each wait inside them has its own bound, and each builds a cluster and runs
# several jobs: test_hosts_faults' link and store cuts took 304 s alone on a quiet machine and
# went past the suite's 900 s guard in CI's full run (2 cores, 4 xdist workers).
HOSTS_PATIENCE = pytest.mark.timeout(1800)
# The longest single tests (minutes each, on 2 cores): sent to the workers first, so none of them
# starts last and ends the suite alone.
STARTS_FIRST = pytest.mark.starts_first


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Put the ``starts_first`` tests first; give each xdist_group test the ``@group`` suffix
    --dist loadgroup schedules by (it sends the groups first, the largest first, then the rest in
    this order).

    pytest-xdist 3.8.0 appends it by setting ``item._nodeid``, which pytest 9 no longer reads
    (a node's id is ``item._id``): without this the groups are silently ignored and HEAVY tests
    run side by side. Only under --dist loadgroup, on the workers (where xdist sets
    ``config.option.loadgroup``), and never twice.
    """
    from _pytest.nodeid import coerce_node_id

    # Stable: the marked tests keep their order, and so do the others (module fixtures).
    items.sort(key=lambda item: item.get_closest_marker("starts_first") is None)
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        } or _module_group(item)
        if names and not item.nodeid.endswith(f"@{'_'.join(sorted(names))}"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(names))}")


def _module_group(item) -> set:
    """A test of no group that uses a module-scoped fixture runs on the worker that runs the
    module's other tests (its group is the module): xdist hands out single tests, and each
    worker that ran one built the module's fixture anew (tests/test_train.py's one training of
    digits ran on all four workers, 13 CPU-s each)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d and d[-1].scope in ("module", "class", "package") for d in defs):
        return {f"module:{item.module.__name__}"}
    return set()


@pytest.fixture(scope="session", autouse=True)
def _sqlite_stores_start_migrated(tmp_path_factory):
    """New SQLite MLflow stores this process opens start as a copy of one already migrated
    (tests/mlflow_template.py; the commands forked from the warm interpreter get theirs from
    it). ``seed_store`` copies the template for the tests that hand a fresh store to a command
    that runs cold."""
    uninstall = mlflow_template.install(mlflow_template.build(tmp_path_factory.mktemp("mlflow")))
    yield
    uninstall()


@pytest.fixture(scope="session")
def digits_table(tmp_path_factory) -> str:
    """scikit-learn's digits as a Delta table partitioned by split (written once per session)."""
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits

    path = str(tmp_path_factory.mktemp("tables") / "digits")
    ingest_sklearn_digits(path)
    return path


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh SQLite tracking store; fails the test if it leaks an active run."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    _forget_active_experiment()
    yield uri
    _forget_active_experiment()
    leaked = mlflow.active_run()
    if leaked is not None:
        mlflow.end_run()
        pytest.fail(f"test leaked an active MLflow run {leaked.info.run_id}")


def _forget_active_experiment() -> None:
    """``mlflow.set_experiment`` in one test must not name an experiment another store lacks.

    It sets a module global and ``MLFLOW_EXPERIMENT_ID`` in ``os.environ``; both outlive the test
    in an xdist worker, and the next test's fresh store has no experiment of that id.
    """
    from mlflow.tracking import fluent

    fluent._active_experiment_id = None
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)


def run_cli(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 600):
    """Run ``keras-dl ARGS`` (or ``python -m ...`` when args start with -m) in a subprocess."""
    from tests.warm_python import REAL_PYTHON

    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    python = sys.executable
    if args[0] == "bench":  # a bench counts its processes' CPU: all of them its descendants
        env["KERAS_DL_COLD_PYTHON"], python = "1", REAL_PYTHON
    cmd = [python, *args] if args[0] == "-m" else [python, "-m", "keras_dl.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def cli_in_process(*args: str, cwd: str | os.PathLike | None = None):
    """Run ``keras-dl ARGS`` in this process: what ``python -m keras_dl.cli ARGS`` runs (its
    ``main``, ``SystemExit`` mapped to the exit status as the interpreter does), without the
    ~5 CPU-s of a new interpreter importing TensorFlow. Returns what :func:`run_cli` does:
    ``.returncode``, ``.stdout``, ``.stderr``.

    For commands that end before any training, Spark session or rank: what the command sets
    for the whole process (``os.environ``, MLflow's tracking URI and active experiment, the
    root logger, warning filters, the working directory) is put back afterwards. A command
    that gets as far as starting the store watchdog fails the test: that thread outlives the
    call and may end the pytest process, so such a test uses :func:`run_cli`. Exit-code tests
    of the real module entry stay on :func:`run_cli` too (tests/test_cli.py).
    """
    import contextlib
    import io
    import logging
    import types
    import warnings

    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils as tracking_utils

    from keras_dl import cli
    from keras_dl.storage import watchdog

    environ, cwd_before = dict(os.environ), os.getcwd()
    tracking_uri, experiment = tracking_utils._tracking_uri, fluent._active_experiment_id
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    watchdogs = len(watchdog._installed)
    out, err = io.StringIO(), io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            if cwd is not None:
                os.chdir(cwd)
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse's errors and --help, as the interpreter maps them
                code = exc.code
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
    finally:
        os.chdir(cwd_before)
        if tracking_utils._tracking_uri != tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        fluent._active_experiment_id = experiment
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update((k, v) for k, v in environ.items() if os.environ.get(k) != v)
        root.handlers[:] = handlers
        root.setLevel(level)
    assert mlflow.active_run() is None, "the command left an MLflow run active in this process"
    assert len(watchdog._installed) == watchdogs, (
        f"keras-dl {' '.join(args)} started the store watchdog: run it with run_cli"
    )
    return types.SimpleNamespace(
        args=list(args), returncode=code or 0, stdout=out.getvalue(), stderr=err.getvalue()
    )


def runs_in(uri: str):
    """Every run of every experiment in the store at ``uri``."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps) if exps else []


def rows_trained_history(uri: str, run) -> list[tuple[int, float]]:
    """``(epoch, rows)`` of ``run``'s ``rows_trained`` metric in the store at ``uri``."""
    import mlflow

    history = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "rows_trained")
    return [(m.step, m.value) for m in history]


def train_digits(table: str, tmp: Path, *sets: str):
    """Train the digits recipe on ``table`` with ``sets`` overrides, tracked in a fresh SQLite
    store under ``tmp``. Returns ``(experiment, TrainResult, tracking_uri)``. The loss curves
    and confusion matrix are not drawn (1.5 of a fit's 8 CPU-s) unless ``sets`` turn
    ``callbacks.plots`` back on, as ``tests/test_train.py`` does."""
    import mlflow

    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    recipe = load_recipe("digits")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri={uri}",
            f"runtime.run_dir={tmp / 'run'}",
            "train.verbose=0",
            "callbacks.plots=false",
            *sets,
        ],
    )
    result = fit(exp, recipe)
    assert mlflow.active_run() is None
    return exp, result, uri


@pytest.fixture(scope="session")
def digits_model(digits_table, tmp_path_factory):
    """The digits recipe trained briefly and registered as ``digits`` version 1 in its own
    SQLite store (once per session). Returns ``(tracking_uri, TrainResult)``."""
    tmp = tmp_path_factory.mktemp("digits_model")
    _, result, uri = train_digits(digits_table, tmp, "train.epochs=4")
    assert result.registered_version == 1
    return uri, result


def write_test_table(
    path, table, rows_per_group, rows_per_file=None, partition_by=None, mode="error"
):
    """Write ``table`` as a Delta table with row groups of ``rows_per_group`` rows.

    deltalake 1.x writes with delta-rs, which cuts files by bytes, not rows (its pyarrow engine's
    ``max_rows_per_file`` went with 1.0). For files of ``rows_per_file`` rows each slice is its
    own commit (append), so the table's version is the number of files minus one.
    """
    from deltalake import write_deltalake

    from keras_dl.storage import delta_row_group_options

    step = rows_per_file or max(table.num_rows, 1)
    for start in range(0, max(table.num_rows, 1), step):
        write_deltalake(
            path,
            table.slice(start, step),
            partition_by=partition_by,
            mode=mode if start == 0 else "append",
            **delta_row_group_options(rows_per_group),
        )
    return path


def _die_with_parent():
    """A ``preexec_fn``: the child gets SIGTERM when this process ends (Linux), even by kill -9.

    Servers the suite starts live in their own session (``start_new_session=True``), so a signal
    sent to pytest's process group (a developer's ^C, a CI timeout, ``kill -- -PGID`` of a
    neighbour's job on a shared machine) does not end them under a suite that goes on; this
    ends them with the pytest process (an xdist worker) that started them instead.
    """
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, before the fork
    return lambda: libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


# petastorm_files: this many files, row groups per file and rows per row group.
PETASTORM_FILES = (5, 4, 10)


@pytest.fixture(scope="session")
def petastorm_files(tmp_path_factory) -> list[str]:
    """Parquet files of ids 0, 1, ... in order (columns id, x = id / 2, name = f"n{id}").

    Named in reverse of the order given, so a sorted listing would read them wrongly.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files, groups, rows = PETASTORM_FILES
    root = tmp_path_factory.mktemp("petastorm_files")
    paths = []
    for k in range(files):
        ids = np.arange(k * groups * rows, (k + 1) * groups * rows)
        table = pa.table({"id": ids, "x": ids * 0.5, "name": [f"n{i}" for i in ids]})
        path = str(root / f"part-{files - k}.parquet")
        pq.write_table(table, path, row_group_size=rows)
        paths.append(path)
    return paths


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Put SIGTERM/SIGINT handlers back after each test.

    An in-process ``fit`` that raises leaves keras_dl's Preemption handler installed (Keras
    skips ``on_train_end`` on an exception); left there it would turn a later SIGTERM or ^C to
    pytest into a checkpoint request and a forced exit (code 75) 25 s later, not a stop.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
