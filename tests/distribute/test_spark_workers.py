"""A failed multi-worker task's report (keras_dl.launch.worker_report) reaches the driver inside
Spark's error text, and the driver names the worker's rank, host and cause from it; with no
SparkSession, MultiWorkerRunner(np>0) says what HorovodRunner says."""

from __future__ import annotations

import pickle
import subprocess
import sys

from keras_dl.distribute.failures import MULTIWORKER, explain_failure
from keras_dl.errors import PREEMPTED_EXIT, HostLost
from keras_dl.launch import worker_report as spark_workers
from tests.conftest import REPO

CLUSTER = ["10.0.0.1:41000", "10.0.0.2:41001"]


def _failed_task_error(tmp_path, stderr: str, rank: int = 1) -> str:
    """What a failed task raises, inside text shaped like Spark's (the report comes twice)."""
    (tmp_path / "stdout").write_text(f"[{rank}]<stdout>:Epoch 1/2\n")
    (tmp_path / "stderr").write_text(stderr)
    host = CLUSTER[rank].split(":")[0]
    report = spark_workers.failed_report(rank, host, 1, tmp_path, CLUSTER)
    task = spark_workers.report_text(report)
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
    spark_workers.keep_output(report, str(logs))
    assert (logs / "rank.1" / "stderr").read_text().endswith("worker 1 fails\n")
    failed = spark_workers.WorkerFailed(1, "10.0.0.2", 1)
    error = explain_failure(failed, str(logs), 2, engine=MULTIWORKER)
    assert "Worker 1" in str(error) and "Horovod" not in str(error), error


# Worker 0's output on the two-host cluster when host 2's link was down past TF's default 10 s
# heartbeat timeout (2026-12-02); worker 1's task could not report.
UNHEALTHY = """\
[0]<stderr>:E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: \
Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):
[0]<stderr>:/job:worker/replica:0/task:1
[0]<stderr>:The tasks have crashed. Check the task logs for an earlier error, or scheduler events
[0]<stderr>:keras_dl rank failed: rank=0 secondary=1 cause=UnavailableError: Graph execution error
"""


def test_a_peer_without_heartbeats_is_a_lost_host_naming_it_and_the_wait(tmp_path):
    report = spark_workers.failure_report(_failed_task_error(tmp_path, UNHEALTHY, rank=0))
    lost = spark_workers.lost_peer(report, 60.0)
    assert isinstance(lost, HostLost) and lost.exit_code == PREEMPTED_EXIT
    assert (lost.rank, lost.host) == (1, "10.0.0.2")
    text = str(lost)
    assert text.startswith("Multi-worker worker 1 on host 10.0.0.2 stopped answering: it sent ")
    assert "no heartbeat for 60 s (runtime.stall_timeout)" in text, text
    assert "worker 0 on host 10.0.0.1 stopped too" in text and "run the same command" in text
    assert pickle.loads(pickle.dumps(lost)).args == lost.args


# Worker 1's output on the two-host cluster after host 2's link was down for 20 s (2026-12-02):
# its collective's call to worker 0 failed when the link came back; worker 0's task was stopped.
DROPPED = """\
[1]<stderr>:keras_dl rank started: rank=1 host=h2 pid=29990 iface=- address=- hostname=-
[1]<stderr>:E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: \
recvmsg:Connection reset by peer
[1]<stderr>:Additional GRPC error information from remote target /job:worker/replica:0/task:0 \
while calling /tensorflow.WorkerService/CompleteInstance:
[1]<stderr>::UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", \
grpc_status:14}
[1]<stderr>:keras_dl rank failed: rank=1 secondary=1 cause=UnavailableError: Graph execution error
"""


def test_a_connection_to_a_peer_dropped_mid_collective_is_a_lost_host(tmp_path):
    report = spark_workers.failure_report(_failed_task_error(tmp_path, DROPPED, rank=1))
    lost = spark_workers.lost_peer(report, 60.0)
    assert isinstance(lost, HostLost), report
    assert (lost.rank, lost.host) == (0, "10.0.0.1")
    text = str(lost)
    assert "worker 1 on host 10.0.0.2 lost its connection to it (10.0.0.1:41000)" in text, text
    assert "(gRPC: recvmsg:Connection reset by peer)" in text, text
    assert "TF's collectives do not reconnect" in text and "run the same command" in text
    # A worker that failed on its own in the same words is not one that lost a peer.
    own = DROPPED.replace("secondary=1", "secondary=0")
    report = spark_workers.failure_report(_failed_task_error(tmp_path, own, rank=1))
    assert spark_workers.lost_peer(report, 60.0) is None


# Worker 1's output on the two-host cluster once host 2, worker 0's, was gone (2026-12-02).
LEADER_GONE = """\
[1]<stderr>:E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort \
DEADLINE_EXCEEDED: Deadline Exceeded
[1]<stderr>:
[1]<stderr>:RPC: /tensorflow.CoordinationService/Heartbeat
[1]<stderr>:keras_dl rank failed: rank=1 secondary=1 cause=DeadlineExceededError: Graph execution
"""


def test_a_heartbeat_the_coordination_leader_never_answered_is_worker_0_lost(tmp_path):
    report = spark_workers.failure_report(_failed_task_error(tmp_path, LEADER_GONE, rank=1))
    lost = spark_workers.lost_peer(report, 60.0)
    assert isinstance(lost, HostLost), report
    assert (lost.rank, lost.host) == (0, "10.0.0.1")
    text = str(lost)
    assert text.startswith("Multi-worker worker 0 on host 10.0.0.1 stopped answering: "), text
    assert "which worker 0 runs (10.0.0.1:41000), and got no answer within 60 s" in text, text


# Worker 1's output on the two-host cluster once host 2, worker 0's, was killed (fresh clone,
# 2026-12-04): its collective's timeout (runtime.stall_timeout) ran out before TF's heartbeats
# told; keras_dl's failed line then said secondary=0, and the job ended 2 as worker 1's failure.
TIMED_OUT = """\
[1]<stderr>:keras_dl rank started: rank=1 host=h1 pid=25056 iface=- address=- hostname=-
[1]<stderr>:E0000 00:00:1796358708.195444   29001 base_collective_executor.cc:252] \
BaseCollectiveExecutor::StartAbort DEADLINE_EXCEEDED: Collective has timed out waiting for other \
workers.
[1]<stderr>:keras_dl rank failed: rank=1 secondary=1 cause=DeadlineExceededError: Graph execution \
error: Detected at node adam/CollectiveReduceV2 ... Collective has timed out waiting for other \
workers. [[{{node adam/CollectiveReduceV2}}]] [Op:__inference_multi_step_on_iterator_2638]
"""


def test_a_collective_that_timed_out_waiting_for_the_other_of_two_is_that_worker_lost(tmp_path):
    report = spark_workers.failure_report(_failed_task_error(tmp_path, TIMED_OUT, rank=1))
    lost = spark_workers.lost_peer(report, 60.0)
    assert isinstance(lost, HostLost) and lost.exit_code == PREEMPTED_EXIT, report
    assert (lost.rank, lost.host) == (0, "10.0.0.1")
    text = str(lost)
    assert text.startswith("Multi-worker worker 0 on host 10.0.0.1 stopped answering: "), text
    assert "worker 1 on host 10.0.0.2 waited 60 s (runtime.stall_timeout) for it" in text, text
    assert "never joined (TF: Collective has timed out waiting for other workers)" in text
    assert spark_workers.stopped_for_peer(report)
    # Of three workers, the timeout does not say which one never joined: no guess.
    three = {**report, "cluster": [*CLUSTER, "10.0.0.3:41002"]}
    assert spark_workers.lost_peer(three, 60.0) is None
    # Nor is it a lost peer when keras_dl's failed line says the worker failed on its own.
    own = spark_workers.failure_report(
        _failed_task_error(tmp_path, TIMED_OUT.replace("secondary=1", "secondary=0"), rank=1)
    )
    assert spark_workers.lost_peer(own, 60.0) is None


def test_a_worker_that_failed_on_its_own_is_not_a_lost_host(tmp_path):
    stderr = "[1]<stderr>:ValueError: worker 1 fails\n"
    report = spark_workers.failure_report(_failed_task_error(tmp_path, stderr))
    assert spark_workers.lost_peer(report, 60.0) is None


# Worker 0's failed line on the two-host cluster when the store was cut from its host
# (2026-12-03): it retried the checkpoint's write for its share of the lease.
STORE_LOST = """\
[0]<stderr>:keras_dl rank failed: rank=0 secondary=0 cause=StoreUnavailable: Object store \
s3://lake unreachable for 16 s, longer than two thirds of runtime.lease_seconds=24: ...
"""


def test_a_worker_that_stopped_for_a_peer_is_told_from_one_that_stopped_for_a_cause(tmp_path):
    """Its task waits PEER_GRACE before failing (keras_dl.launch.spark_workers): the peer's
    own report, the cause, reaches the driver first. One that lost the store skips the wait
    for the chief's end marker, on that store."""

    def report(stderr: str, rank: int = 1) -> dict:
        return spark_workers.failure_report(_failed_task_error(tmp_path, stderr, rank=rank))

    for stderr, rank in ((DROPPED, 1), (UNHEALTHY, 0), (LEADER_GONE, 1)):
        assert spark_workers.stopped_for_peer(report(stderr, rank)), stderr
        assert not spark_workers.lost_store(report(stderr, rank)), stderr
    assert not spark_workers.stopped_for_peer(report(DROPPED.replace("secondary=1", "secondary=0")))
    assert not spark_workers.stopped_for_peer(report("[1]<stderr>:ValueError: worker 1 fails\n"))
    lost = report(STORE_LOST, rank=0)
    assert spark_workers.lost_store(lost) and not spark_workers.stopped_for_peer(lost)


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
