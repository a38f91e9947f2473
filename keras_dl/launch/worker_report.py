"""A failed multi-worker Spark task's report, from the task to the driver, and what the driver
makes of it (:mod:`keras_dl.launch.spark_workers`).

A worker that exits non-zero fails its task with an error whose text holds its report as one
JSON line (rank, host, exit status, the cluster's addresses, its last lines); Spark carries that
text to the driver inside the stage's failure. The driver copies the lines to its logs folder
and raises :class:`WorkerFailed` (explained like a Horovod rank's failure), or
:class:`~keras_dl.errors.HostLost` when the report says a peer went silent (:func:`lost_peer`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from keras_dl.errors import HostLost

_REPORT = "keras_dl-worker-failed "  # starts a failed task's report in its error (one JSON line)
_TAIL = 200  # lines of each stream a failed worker's report carries to the driver
_LINE = 4000  # characters of each of those lines
# TF's coordination service, in a worker's output, on a peer silent for its heartbeat timeout.
_UNHEALTHY_RE = re.compile(
    r"stopped sending heartbeats\):\s*(?:\[\d+\]<\w+>:)?/job:worker/replica:\d+/task:(\d+)"
)


# A collective's call to a peer that failed with gRPC's UNAVAILABLE (status 14).
_DROPPED_RE = re.compile(
    r"UNAVAILABLE: [^\n]*\n(?:\[\d+\]<\w+>:)?Additional GRPC error information from remote "
    r"target /job:worker/replica:\d+/task:(\d+) while calling"
)
_GRPC_MESSAGE_RE = re.compile(r'grpc_message:"([^"]+)"')
# The heartbeat a worker sends the coordination service (on worker 0, the leader) timed out.
_LEADER_RE = re.compile(
    r"DEADLINE_EXCEEDED: Deadline Exceeded\s*(?:\[\d+\]<\w+>:\s*)*"
    r"RPC: /tensorflow\.CoordinationService/Heartbeat"
)
# A collective whose timeout (runtime.stall_timeout) ran out before every worker joined it.
_TIMED_OUT = "Collective has timed out waiting for other workers"
_SECONDARY = " secondary=1 cause="  # keras_dl's failed line: the worker stopped for a peer
_STORE_LOST = "StoreUnavailable: Object store "  # in its failed line: it stopped for the store


class WorkerFailed(RuntimeError):
    """A worker of a Spark job exited non-zero: in Horovod's words, for ``explain_failure``."""

    def __init__(self, rank: int, host: str, code: int):
        super().__init__(
            f"A multi-worker process exited with non-zero status. Process name: {rank} "
            f"Exit code: {code}"
        )
        self.rank, self.host, self.code = rank, host, code


def failure_report(text: str) -> dict | None:
    """The first failed worker's report in a Spark error's text, or None."""
    at = text.find(_REPORT)
    if at < 0:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(text, at + len(_REPORT))
    except ValueError:
        return None
    return report


def lost_peer(report: dict, heartbeat: float) -> HostLost | None:
    """:class:`HostLost` for the peer a failed worker's report says it lost, or None.

    Four kinds of evidence, in the words of a worker that stopped because of that peer (TF's
    coordination service, or its ``keras_dl rank failed`` line saying ``secondary=1``): the
    service declared the peer unhealthy (no heartbeat for ``heartbeat`` seconds); a
    collective's call to the peer failed with gRPC's UNAVAILABLE (a connection reset or closed:
    TF's collectives do not reconnect); the worker's own heartbeat to the service, which
    worker 0 runs, timed out (worker 0 is the peer); or a collective waited its timeout
    (``runtime.stall_timeout``) for a peer that never joined, which names the peer only in a
    cluster of two workers (of more, None: the report then stands as the worker's own). The
    peer's own task could not report first (its host, its process or the network to it went
    down), so this report is the stage's.
    """
    text = "".join(report.get("stderr", []))
    unhealthy = _UNHEALTHY_RE.search(text)
    secondary = _SECONDARY in text
    dropped = _DROPPED_RE.search(text) if unhealthy is None and secondary else None
    leader = _LEADER_RE.search(text) if secondary else None
    cluster = report.get("cluster") or []
    timed_out = secondary and _TIMED_OUT in text and len(cluster) == 2
    if unhealthy is not None or dropped is not None:
        peer = int((unhealthy or dropped).group(1))
    elif leader is not None:
        peer = 0  # the coordination service's leader: worker 0 (a cluster of workers only)
    elif timed_out:
        peer = 1 - report["rank"]  # the other of two
    else:
        return None
    if peer == report["rank"]:
        return None
    at = cluster[peer] if peer < len(cluster) else "(not in the report)"
    me = f"worker {report['rank']} on host {report['host']}"
    waited = f"{heartbeat:.0f} s (runtime.stall_timeout)" if heartbeat else "its timeout"
    if unhealthy is not None:
        silence = (
            f"it sent TF's coordination service no heartbeat for {waited}, so its host or the "
            f"network to it is gone, and {me} stopped too"
        )
    elif dropped is not None:
        why = _GRPC_MESSAGE_RE.search(text[dropped.start() :])
        silence = (
            f"{me} lost its connection to it ({at}) in a collective (gRPC: "
            f"{why.group(1) if why else 'UNAVAILABLE'}), and TF's collectives do not reconnect: "
            "its host, its process or the network between them went down"
        )
    elif leader is None:
        silence = (
            f"{me} waited {waited} for it in a collective and it never joined (TF: {_TIMED_OUT}), "
            "so its host, its process or the network to it is gone, or it hung"
        )
    else:
        silence = (
            f"{me} sent its heartbeat to TF's coordination service, which worker 0 runs "
            f"({at}), and got no answer within {waited} (gRPC: Deadline Exceeded), so worker "
            "0's host or the network to it is gone"
        )
    return HostLost(
        peer, at.rsplit(":", 1)[0], heartbeat, worker="Multi-worker worker", silence=silence
    )


def keep_output(report: dict, logs: str, printed: bool = False) -> None:
    """Copy the failed worker's last lines to ``logs/rank.R``; print them here unless they
    were ``printed`` live."""
    folder = Path(logs, f"rank.{report['rank']}")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("stdout", "stderr"):
        lines = report.get(name, [])
        Path(folder, name).write_text("".join(lines))
        if not printed:
            (sys.stdout if name == "stdout" else sys.stderr).write("".join(lines))
    sys.stdout.flush()
    sys.stderr.flush()


def first_lines(text: str, n: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:n])


def failed_report(rank: int, host: str, code: int, folder: Path, cluster: list[str]) -> dict:
    """A failed worker's report: its rank, host, exit status, the cluster's addresses and the
    last lines of its output (``folder/stdout``, ``folder/stderr``)."""
    report: dict = {"rank": rank, "host": host, "code": code, "cluster": list(cluster)}
    for name in ("stdout", "stderr"):
        path = folder / name
        lines = path.read_text(errors="replace").splitlines(keepends=True) if path.exists() else []
        report[name] = [
            line if len(line) <= _LINE else line[:_LINE] + " ...\n" for line in lines[-_TAIL:]
        ]
    return report


def report_text(report: dict) -> str:
    """A failed task's error: the words, then its report as one JSON line for the driver."""
    return (
        f"Multi-worker worker {report['rank']} on host {report['host']} exited with status "
        f"{report['code']}.\n{_REPORT}{json.dumps(report)}"
    )


def stopped_for_peer(report: dict) -> bool:
    """Whether the worker stopped because of a peer (keras_dl's failed line says
    ``secondary=1``, or TF's coordination service declared a peer unhealthy): its report is
    not the cause, and the peer's own, if its task still runs, should reach the driver first."""
    text = "".join(report.get("stderr", []))
    return _SECONDARY in text or _UNHEALTHY_RE.search(text) is not None


def lost_store(report: dict) -> bool:
    """Whether the worker stopped because the object store stayed unreachable from its host
    (:class:`~keras_dl.errors.StoreUnavailable`): its task cannot reach that store either."""
    return _STORE_LOST in "".join(report.get("stderr", []))
