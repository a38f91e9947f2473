"""pytest plugin for running Petastorm's own tests against keras_dl's compatibility layer.

``test_petastorm_suite.py`` runs ``python -m pytest -p tests.petastorm_suite.plugin <the
installed petastorm's tests>`` in a subprocess. This plugin:

- registers the Petastorm import hook (as the .pth file installed with keras-dl does) and puts it
  ahead of pytest's assertion rewriter, so Petastorm's test modules, being ``petastorm.*``
  modules, load through it like the rest of Petastorm;
- shims what Petastorm's tests need from the libraries of their time and the environment no
  longer gives (pytest < 8, pandas 1, Python < 3.11, pytest-logger, pytest-forked), and gives
  process-pool workers longer to start on a loaded machine: test helpers only, never what
  Petastorm computes;
- under pytest-xdist, has the workers share the session's synthetic datasets: the first worker
  to need one makes it with Petastorm's own fixture code (a Spark job, about 45 CPU-seconds
  here for ``synthetic_dataset``), the others wait for it and read the same files;
- marks the tests listed in ``expected_failures.txt`` as expected failures, each with its
  one-line reason (strict unless the reason starts with ``flaky:``), and deselects those listed
  in ``duplicates.txt`` (each with why another test covers it);
- writes a JSON summary (outcome counts, how many were deselected, listed tests not collected)
  to ``$KERAS_DL_PETASTORM_SUITE_REPORT``. Under pytest-xdist the workers collect and send what
  they found to the controller, which writes the summary.
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import os
import pickle
import sys
import warnings
from pathlib import Path

import pytest

EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.txt")
DUPLICATES = Path(__file__).with_name("duplicates.txt")
REPORT_ENV = "KERAS_DL_PETASTORM_SUITE_REPORT"
_WORKER_START_S = 120


def read_expected_failures() -> dict[str, str]:
    """``{"tests/test_x.py::test_name[param]": reason}`` from ``expected_failures.txt``."""
    return _read_listed(EXPECTED_FAILURES)


def read_duplicates() -> dict[str, str]:
    """``{"tests/test_x.py::test_name[param]": why}`` from ``duplicates.txt``."""
    return _read_listed(DUPLICATES)


def _read_listed(path: Path) -> dict[str, str]:
    listed = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            test, sep, reason = (part.strip() for part in line.partition(" | "))
            if not sep or not reason:
                raise pytest.UsageError(f"{path}: no ' | reason' in {line!r}")
            if test in listed:
                raise pytest.UsageError(f"{path}: {test} is listed twice")
            listed[test] = reason
    return listed


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(_LoggerHookSpec)


def pytest_configure(config):
    _put_the_hook_first()
    _shim_the_test_environment()
    config.addinivalue_line("markers", "forked: run in a forked process (pytest-forked; not here)")


# Tests that start a Spark JVM of their own in a child process: 34 s alone, past the run's
# 300 s per test at load 12 on 2 cores (seen once in a whole-suite run). Their own, longer limit.
PATIENT = {"tests/test_spark_dataset_converter.py::test_atexit": 900}


def pytest_collection_modifyitems(config, items):
    expected, duplicates = read_expected_failures(), read_duplicates()
    both = set(expected) & set(duplicates)
    if both:
        raise pytest.UsageError(f"both expected to fail and left out as duplicates: {both}")
    seen, kept, deselected = set(), [], []
    for item in items:
        key = _key(item)
        if key in duplicates:
            seen.add(key)
            deselected.append(item)
            continue
        if key in PATIENT:
            item.add_marker(pytest.mark.timeout(PATIENT[key]))
        if key in expected:
            seen.add(key)
            reason = expected[key]
            item.add_marker(
                pytest.mark.xfail(reason=reason, strict=not reason.startswith("flaky:"))
            )
        kept.append(item)
    if hasattr(config, "workerinput"):
        _share_the_synthetic_datasets(config)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    found = {"unmatched": sorted((set(expected) | set(duplicates)) - seen)}
    found["deselected"] = len(deselected)
    config.stash[_found] = found
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller writes the summary
        config.workeroutput[_FOUND_KEY] = found


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: keep what a worker found at collection (each collects every test)."""
    found = getattr(node, "workeroutput", {}).get(_FOUND_KEY)
    if found is not None:
        node.config.stash[_found] = found


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if path and not hasattr(session.config, "workerinput"):
        stats = session.config.pluginmanager.get_plugin("terminalreporter").stats
        found = session.config.stash.get(_found, {"unmatched": None, "deselected": None})
        summary = {
            "outcomes": {k: len(v) for k, v in stats.items() if k and k not in _NOT_OUTCOMES},
            **found,
            "exitstatus": int(exitstatus),
        }
        Path(path).write_text(json.dumps(summary, indent=1))


_found = pytest.StashKey[dict]()
_FOUND_KEY = "keras_dl_petastorm_suite"
_NOT_OUTCOMES = ("warnings", "deselected")


class _LoggerHookSpec:
    """Petastorm's conftest implements pytest-logger's hook; declare it so pytest accepts it."""

    @pytest.hookspec(historic=True)
    def pytest_logger_config(self, logger_config):
        """pytest-logger's logger configuration hook (unused here)."""


def _key(item) -> str:
    """The item as ``expected_failures.txt`` names it: its file inside the petastorm package."""
    path = Path(item.path)
    package = next(p for p in path.parents if p.name == "petastorm")
    return f"{path.relative_to(package).as_posix()}::{item.nodeid.split('::', 1)[1]}"


def _put_the_hook_first() -> None:
    import keras_dl_petastorm_hook

    keras_dl_petastorm_hook.register()  # a no-op when the .pth file already did
    finder = next(
        f for f in sys.meta_path if isinstance(f, keras_dl_petastorm_hook.PetastormFinder)
    )
    sys.meta_path.remove(finder)
    sys.meta_path.insert(0, finder)  # its loader then wraps pytest's rewriting one


def _shim_the_test_environment() -> None:
    import pandas.testing

    # pandas 2 removed pandas.util.testing (test_arrow_table_serializer.py:18 imports it).
    sys.modules.setdefault("pandas.util.testing", pandas.testing)
    # Python 3.11 removed inspect.getargspec (test_tf_utils.py:50).
    if not hasattr(inspect, "getargspec"):
        inspect.getargspec = inspect.getfullargspec
    # pytest 8 removed pytest.warns(None) (test_unischema.py:320, test_tf_dataset.py:139): it
    # recorded every warning.
    warns = pytest.warns

    def warns_or_record(expected_warning=Warning, *args, **kwargs):
        if expected_warning is None:
            return _record_warnings()
        return warns(expected_warning, *args, **kwargs)

    pytest.warns = warns_or_record
    # Petastorm waits 20 s for each process-pool worker (a fresh interpreter) to start
    # (process_pool.py:41,210). On 2 cores shared at a load of 15-20 that was not enough: wait
    # up to 120 s at start-up only (the same constant also bounds a ventilate that cannot send,
    # which test_exception_in_all_worker_process waits out).
    from petastorm.workers_pool import process_pool

    wait_for_workers = process_pool.ProcessPool._wait_for_workers_to_start

    def patient_wait_for_workers(self):
        budget = process_pool._KEEP_TRYING_WHILE_ZMQ_AGAIN_IS_RAIZED_TIMEOUT_S
        process_pool._KEEP_TRYING_WHILE_ZMQ_AGAIN_IS_RAIZED_TIMEOUT_S = _WORKER_START_S
        try:
            return wait_for_workers(self)
        finally:
            process_pool._KEEP_TRYING_WHILE_ZMQ_AGAIN_IS_RAIZED_TIMEOUT_S = budget

    process_pool.ProcessPool._wait_for_workers_to_start = patient_wait_for_workers


def _share_the_synthetic_datasets(config) -> None:
    """Make each session dataset of Petastorm's conftest once for all xdist workers.

    Its session fixtures (``synthetic_dataset``, ``scalar_dataset``...) each call
    ``maybe_cached_dataset(config, name, generating_func)`` (``tests/conftest.py:57``), which is
    where Petastorm's own ``--cache-synthetic-dataset`` reuses a dataset made before. Here the
    first worker calls ``generating_func`` under a lock in the run's root folder and pickles the
    result (the dataset's URL, path and rows) beside it; the others load that once the lock is
    free. Every worker starts a new session, so nothing outlives the run.
    """
    conftest = sys.modules.get("petastorm.tests.conftest")
    if conftest is None or getattr(conftest.maybe_cached_dataset, "_shared", False):
        return
    folder = Path(config.rootpath, "shared-datasets")
    folder.mkdir(exist_ok=True)

    def shared_dataset(config, name, generating_func):
        made = folder / f"{name}.pickle"
        with open(folder / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if made.exists():
                return pickle.loads(made.read_bytes())
            dataset = generating_func()
            made.with_suffix(".tmp").write_bytes(pickle.dumps(dataset))
            made.with_suffix(".tmp").rename(made)
            return dataset

    shared_dataset._shared = True
    conftest.maybe_cached_dataset = shared_dataset


@contextlib.contextmanager
def _record_warnings():
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        yield recorded
