"""How a failed job is explained, from the rank reports Horovod's launcher leaves behind."""

from __future__ import annotations

import re

import pytest

from keras_dl.distribute.failures import explain_failure

HOROVOD = (
    "Horovod detected that one or more processes exited with non-zero status, thus causing the "
    "job to be terminated. The first process to do so was:\nProcess name: {rank}\nExit code: "
    "{code}\n"
)
SHUTDOWN = "UnknownError: Graph execution error: ... Horovod has been shut down. This was caused"


def _logs(tmp_path, reports: dict[int, tuple[int, str]]) -> str:
    for rank, (secondary, cause) in reports.items():
        d = tmp_path / f"rank.{rank}"
        d.mkdir()
        (d / "stderr").write_text(
            f"noise\nkeras_dl rank failed: rank={rank} secondary={secondary} cause={cause}\n"
        )
    return str(tmp_path)


@pytest.mark.parametrize(
    ("first", "reports", "expected"),
    [
        # The raising rank's own error wins over the rank stopped by the shutdown.
        ((0, 1), {0: (1, SHUTDOWN), 1: (0, "ValueError: bad")}, "rank 1 failed: ValueError: bad"),
        # Killed: no report of its own, and Horovod saw it exit first.
        ((1, -9), {0: (1, SHUTDOWN)}, r"rank 1 died: killed by signal 9 \(SIGKILL\)"),
        # Killed, but the stopped rank exited first: the silent rank is the culprit.
        ((0, 1), {0: (1, SHUTDOWN)}, "rank 1 died without an error of its own"),
        # Its executor died: Horovod's Spark launcher has no exit code (was: "rank 0 failed:
        # ... Horovod has been shut down", the rank the dead one's peers stopped).
        ((1, None), {0: (1, SHUTDOWN)}, "rank 1 died: its Spark task ended without an exit code"),
        # Out of memory in native code: exit 137 is SIGKILL too.
        ((2, 137), {}, r"rank 2 died: killed by signal 9 \(SIGKILL\)"),
    ],
)
def test_the_failing_rank_and_its_cause_are_named(tmp_path, first, reports, expected):
    exc = RuntimeError(HOROVOD.format(rank=first[0], code=first[1]))
    error = explain_failure(exc, _logs(tmp_path, reports), size=3 if first[0] == 2 else 2)
    assert re.search(expected, str(error)), str(error)


def test_a_rank_that_diverged_fails_the_job_as_diverged_not_as_a_distributed_error(tmp_path):
    from keras_dl.distribute.recovery import restartable
    from keras_dl.errors import DistributedError, DivergenceError
    from keras_dl.tracking import failure_tags

    exc = RuntimeError(HOROVOD.format(rank=1, code=1))
    reports = {0: (0, "DivergenceError: Training diverged: loss grew"), 1: (1, SHUTDOWN)}
    error = explain_failure(exc, _logs(tmp_path, reports), size=2)
    assert type(error) is DivergenceError and error.exit_code == 3
    assert str(error).startswith("Horovod rank 0 failed: DivergenceError: Training diverged")
    assert failure_tags(error)["keras_dl.failure"] == "diverged" and not restartable(error)
    (tmp_path / "b").mkdir()
    other = explain_failure(exc, _logs(tmp_path / "b", {0: (0, "ValueError: x")}), size=2)
    assert type(other) is DistributedError


def test_ranks_that_lost_the_store_stop_the_job_as_store_unavailable_exit_75(tmp_path):
    """A rank that gave up on the store is resumable (exit 75), like a preempted one."""
    from keras_dl.distribute.recovery import restartable
    from keras_dl.errors import StoreUnavailable

    lost = StoreUnavailable("s3://lake", 41.0, True, "curlCode: 28, Timeout was reached")
    exc = RuntimeError(HOROVOD.format(rank=0, code=75))
    reports = {0: (0, f"StoreUnavailable: {lost}"), 1: (1, SHUTDOWN)}
    error = explain_failure(exc, _logs(tmp_path, reports), size=2)
    assert type(error) is StoreUnavailable and error.exit_code == 75, repr(error)
    assert str(error) == str(lost) and restartable(error)
    # One rank preempted and one that lost the store: still resumable, named by the store.
    (tmp_path / "b").mkdir()
    both = {0: (0, "Preempted: Preempted by SIGTERM: stopped after step 7, ..."), 1: reports[0]}
    assert type(explain_failure(exc, _logs(tmp_path / "b", both), size=2)) is StoreUnavailable
    # A rank that failed for another reason makes it a failure.
    (tmp_path / "c").mkdir()
    mixed = {0: reports[0], 1: (0, "ValueError: x")}
    assert type(explain_failure(exc, _logs(tmp_path / "c", mixed), size=2)) is not StoreUnavailable
