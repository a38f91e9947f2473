"""A failed multi-worker task's report (keras_dl.launch.spark_workers) reaches the driver inside
Spark's error text, and the driver names the worker's rank, host and cause from it; with no
SparkSession, MultiWorkerRunner(np>0) says what HorovodRunner says."""

from __future__ import annotations

import subprocess
import sys

from keras_dl.distribute.failures import explain_failure
from keras_dl.launch import spark_workers
from keras_dl.launch.workers import _in_words
from tests.conftest import REPO


def _failed_task_error(tmp_path, stderr: str) -> str:
    """What a failed task raises, inside text shaped like Spark's (the report comes twice)."""
    (tmp_path / "stdout").write_text("[1]<stdout>:Epoch 1/2\n")
    (tmp_path / "stderr").write_text(stderr)
    task = spark_workers._report_text(1, "10.0.0.2", 1, tmp_path)
    return (
        "An error occurred while calling o42.collectAndServe.\n: org.apache.spark.SparkException:"
        " Job aborted due to stage failure: Could not recover from a failed barrier ResultStage."
        f"\norg.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        f"RuntimeError: {task}\n\tat org.apache.spark...\nCaused by: RuntimeError: {task}\n"
    )


def test_a_failed_workers_report_names_its_rank_host_and_cause(tmp_path):
    stderr = "[1]<stderr>:" + "x" * 9000 + "\n[1]<stderr>:ValueError: worker 1 fails\n"
    text = _failed_task_error(tmp_path, stderr)
    report = spark_workers.failure_report(text)
    assert (report["rank"], report["host"], report["code"]) == (1, "10.0.0.2", 1)
    assert report["stdout"] == ["[1]<stdout>:Epoch 1/2\n"]
    assert len(report["stderr"][0]) < 4100  # a long line is cut, the next kept whole
    assert report["stderr"][1] == "[1]<stderr>:ValueError: worker 1 fails\n"

    logs = tmp_path / "logs"
    spark_workers._keep_output(report, str(logs))
    assert (logs / "rank.1" / "stderr").read_text().endswith("worker 1 fails\n")
    error = _in_words(explain_failure(spark_workers.WorkerFailed(1, "10.0.0.2", 1), str(logs), 2))
    assert "Worker 1" in str(error) and "Horovod" not in str(error), error


def test_spark_text_without_a_report_is_none():
    assert spark_workers.failure_report("Job aborted: executor lost") is None
    assert spark_workers.failure_report("keras_dl-worker-failed {not json") is None


def test_with_no_session_np_2_says_what_horovodrunner_says():
    """In a process of its own: no SparkSession there for certain."""
    code = (
        "from keras_dl.errors import DistributedError\n"
        "from keras_dl.launch import HorovodRunner, MultiWorkerRunner\n"
        "for runner in (MultiWorkerRunner(np=2), HorovodRunner(np=2)):\n"
        "    try:\n"
        "        runner.run(print)\n"
        "    except DistributedError as exc:\n"
        "        print('ERROR', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert errors[0] == errors[1], errors
    assert "no active SparkSession" in errors[0], errors
