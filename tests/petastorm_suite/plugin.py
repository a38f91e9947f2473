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
- marks the tests listed in ``expected_failures.txt`` as expected failures, each with its
  one-line reason (strict unless the reason starts with ``flaky:``), and writes a JSON summary (outcome counts, listed tests not collected) to
  ``$KERAS_DL_PETASTORM_SUITE_REPORT``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import warnings
from pathlib import Path

import pytest

EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.txt")
REPORT_ENV = "KERAS_DL_PETASTORM_SUITE_REPORT"
_WORKER_START_S = 120


def read_expected_failures() -> dict[str, str]:
    """``{"tests/test_x.py::test_name[param]": reason}`` from ``expected_failures.txt``."""
    expected = {}
    for line in EXPECTED_FAILURES.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            test, sep, reason = (part.strip() for part in line.partition(" | "))
            if not sep or not reason:
                raise pytest.UsageError(f"{EXPECTED_FAILURES}: no ' | reason' in {line!r}")
            expected[test] = reason
    return expected


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(_LoggerHookSpec)


def pytest_configure(config):
    _put_the_hook_first()
    _shim_the_test_environment()
    config.addinivalue_line("markers", "forked: run in a forked process (pytest-forked; not here)")


def pytest_collection_modifyitems(config, items):
    expected = read_expected_failures()
    seen = set()
    for item in items:
        key = _key(item)
        if key in expected:
            seen.add(key)
            reason = expected[key]
            item.add_marker(
                pytest.mark.xfail(reason=reason, strict=not reason.startswith("flaky:"))
            )
    config.stash[_unmatched] = sorted(set(expected) - seen)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if path:
        stats = session.config.pluginmanager.get_plugin("terminalreporter").stats
        summary = {
            "outcomes": {k: len(v) for k, v in stats.items() if k and k != "warnings"},
            "unmatched": session.config.stash.get(_unmatched, []),
            "exitstatus": int(exitstatus),
        }
        Path(path).write_text(json.dumps(summary, indent=1))


_unmatched = pytest.StashKey[list]()


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


@contextlib.contextmanager
def _record_warnings():
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        yield recorded
