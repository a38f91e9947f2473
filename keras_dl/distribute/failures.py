"""How a failed Horovod job is explained: which rank failed first, and why.

A rank that raises writes one marker line (then its traceback) to its stderr before it exits;
the launcher keeps a copy of every rank's output, and after Horovod reports "a process exited
non-zero" it reads the markers back to name the rank and the exception. A rank that was killed
leaves no marker: its exit status (a signal) is the cause.

A keras_dl error (a :class:`~keras_dl.errors.DataError` on the rank that read a bad file, ...)
reaches the caller as the same class, so with its exit code: the rank writes a second line with
the class's name and its whole message as a JSON string, and the launcher rebuilds the error
from a fixed table of keras_dl.errors' classes. Nothing in a rank's output is unpickled or run:
it travels as text (over the network from Spark executors), and an unknown name is ignored.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from keras_dl.distribute.deaths import describe_death, describe_exit, on_host
from keras_dl.distribute.network_errors import (
    TASK_TO_TASK_TIMEOUT,
    explain_rendezvous_timeout,
    explain_task_to_task_timeout,
    explain_unreachable_peer,
    gloo_failure,
    rank_places,
)
from keras_dl.errors import (
    ConfigError,
    DataError,
    DistributedError,
    DivergenceError,
    KerasDLError,
    NotRegistered,
    Preempted,
    RunError,
    SparkConnectError,
    StoreUnavailable,
)

_MARKER = "keras_dl rank failed:"
_MARKER_RE = re.compile(re.escape(_MARKER) + r" rank=(\d+) secondary=([01]) cause=(.*)")
_ERROR = "keras_dl rank error:"
_ERROR_RE = re.compile(
    re.escape(_ERROR) + r" rank=(\d+) class=(\w+) name=(\w+) message=(\".*\")\s*$"
)
# The classes a rank's error is rebuilt as, from their name and message (the most derived
# first: a subclass defined elsewhere in keras_dl travels as its nearest one here). Preempted
# and StoreUnavailable have their own path (_resumable).
_REBUILT = {
    cls.__name__: cls
    for cls in (ConfigError, DataError, DivergenceError, NotRegistered, RunError)
    + (SparkConnectError, DistributedError, KerasDLError)
}
_MAX_MESSAGE = 20_000


@dataclass(frozen=True)
class Engine:
    """How an explanation names a job's processes: Horovod's ranks, or TF's workers."""

    rank: str = "Horovod rank"  # "Horovod rank 1 failed"
    ranks: str = "Horovod ranks"
    job: str = "Horovod job"
    others: str = "The other ranks"


HOROVOD = Engine()
MULTIWORKER = Engine(
    rank="Worker", ranks="workers", job="multi-worker job", others="The other workers"
)
# Ranks that fail *because* another rank died report Horovod's shutdown, or (multi-worker) TF's
# word that a peer task is gone from a collective: not the cause.
_SECONDARY = (
    "Horovod has been shut down",
    "HorovodInternalError",
    "The tasks have crashed",  # UnavailableError of a collective whose peer task died
    "Collective ops is aborted by",  # the other collectives of that step, aborted with it
    # DeadlineExceededError of a collective whose timeout (runtime.stall_timeout) ran out: a
    # peer never joined it (its host died before TF's heartbeats told; 2026-12-04).
    "Collective has timed out waiting for other workers",
)


def report_failure(exc: BaseException) -> None:
    """On a rank: write the marker line and the traceback of ``exc`` to stderr, and flush."""
    rank = os.environ.get("HOROVOD_RANK", os.environ.get("KERAS_DL_RANK", "?"))  # multi-worker
    cause = " ".join(f"{type(exc).__name__}: {exc}".split())
    # Judged on the whole message: TF puts Horovod's shutdown notice after a long traceback.
    secondary = int(any(s in cause for s in _SECONDARY))
    if len(cause) > 600:  # the head names the error, the tail often holds its reason
        cause = f"{cause[:300]} ... {cause[-300:]}"
    kind = _rebuilt_kind(exc)
    if kind is not None and not secondary:
        message = json.dumps(str(exc)[:_MAX_MESSAGE])  # one line, whatever the message holds
        name = type(exc).__name__  # the text names it, as the cause does (StallError, ...)
        sys.stderr.write(f"{_ERROR} rank={rank} class={kind} name={name} message={message}\n")
    sys.stderr.write(f"{_MARKER} rank={rank} secondary={secondary} cause={cause}\n")
    traceback.print_exc()
    sys.stderr.flush()
    sys.stdout.flush()


_PREEMPTED_RE = re.compile(r"Preempted by (\w+)[^:]*: stopped after step (-?\d+)")
_STORE_RE = re.compile(r"StoreUnavailable: Object store (\S+) unreachable for (\d+) s")
_LAST_ERROR_RE = re.compile(r"\(last error: (.*?)\)\. Nothing is lost")


def _resumable(causes: list[str]) -> KerasDLError | None:
    """:class:`Preempted` or :class:`StoreUnavailable` (exit 75) when every cause is one of them.

    A rank that stopped because the object store stayed unreachable stopped as a preempted one
    does: the job is rerun to resume, not reported as a failure of the code (exit 1).
    """
    stops = [_STORE_RE.search(c) or _PREEMPTED_RE.search(c) for c in causes]
    if not stops or not all(stops):
        return None
    for cause, m in zip(causes, stops):
        if m.re is _STORE_RE:
            last = _LAST_ERROR_RE.search(cause)
            leased = "lease on runtime.run_dir" in cause
            return StoreUnavailable(
                m.group(1),
                float(m.group(2)),
                leased,
                last.group(1) if last else "see the ranks' output",
            )
    return Preempted(stops[0].group(1), int(stops[0].group(2)))


def explain_failure(
    exc: Exception,
    logs: str,
    size: int = 0,
    started: float | None = None,
    engine: Engine = HOROVOD,
) -> KerasDLError:
    """Turn Horovod's "a process exited non-zero" into an error naming the rank and the cause,
    or into :class:`~keras_dl.errors.Preempted` when the ranks stopped on SIGTERM/SIGINT.

    A rank that left no report of its own is explained from what it left: a Gloo connect
    failure in its output (:mod:`~keras_dl.distribute.network_errors`: both addresses, the
    interface and the fix), else its exit status, with the OOM killer named only when the
    exit was SIGKILL or the kernel's log says it killed the rank's process
    (:mod:`~keras_dl.distribute.kernel_log`).

    Args:
        exc: What Horovod's launcher raised.
        logs: Folder holding a copy of every rank's output (searched recursively).
        size: Number of ranks, to find one that died without a word. Defaults to 0 (unknown).
        started: When the job started (:func:`~keras_dl.distribute.kernel_log.job_clock`):
            the kernel's log is read from then on. Defaults to None (since boot).
        engine: How the text names the processes: :data:`HOROVOD` (ranks), or
            :data:`MULTIWORKER` (TF's workers). Defaults to HOROVOD.
    """
    w = engine
    text = str(exc)
    causes: dict[int, str] = {}
    primary: dict[int, str] = {}
    errors: dict[int, KerasDLError] = {}
    outputs = rank_outputs(logs)
    for lines in outputs.values():
        for line in lines:
            m = _MARKER_RE.search(line)
            if m:
                rank, cause = int(m.group(1)), m.group(3).strip()
                causes.setdefault(rank, cause)
                if m.group(2) == "0":
                    primary.setdefault(rank, cause)
            e = _ERROR_RE.search(line)
            if e and int(e.group(1)) not in errors:
                error = _rebuild(int(e.group(1)), *e.group(2, 3, 4), engine)
                if error is not None:
                    errors[int(e.group(1))] = error
    places = rank_places(line for lines in outputs.values() for line in lines)
    # "Exit code: None": the rank's Spark task ended without one (its executor or host gone).
    first = re.search(r"Process name: (\d+)\s+Exit code: (-?\d+|None)", text)
    first_rank = int(first.group(1)) if first else None
    resumable = _resumable(list(primary.values()))
    if resumable is not None:  # every rank that stopped on its own was preempted, or lost the store
        return resumable
    if primary:
        rank = first_rank if first_rank in primary else min(primary)
        if rank in errors:  # a keras_dl error: its class, exit code and whole message
            return errors[rank]
        # A diverged model stays a DivergenceError (exit code 3, tagged diverged, not retried).
        kind = DivergenceError if primary[rank].startswith("DivergenceError:") else DistributedError
        return kind(_failed(rank, primary[rank], engine))
    # A rank that could not reach a peer aborts in native code: Gloo's words are in its output.
    suspects = [r for r in (first_rank,) if r is not None] + sorted(outputs)
    for rank in dict.fromkeys(suspects):
        failure = gloo_failure(outputs.get(rank, ()))
        if failure is not None and rank not in causes:
            return DistributedError(explain_unreachable_peer(rank, failure, places))
        waited = explain_rendezvous_timeout(rank, outputs.get(rank, ()), places)
        if waited is not None and rank not in causes:
            return DistributedError(waited)
    silent = [r for r in range(size) if r not in causes]
    if first_rank in causes and silent:
        # Horovod saw a rank that only reported the shutdown exit first; the culprit is the
        # rank that left no report at all (killed, or crashed in native code).
        rank = silent[0]
        return DistributedError(
            f"{w.rank} {rank} died without an error of its own (killed, or crashed in "
            f"native code){on_host(places, rank)}, so the job was stopped. Check its output "
            f"above (lines prefixed [{rank}]).{describe_death(rank, None, places, outputs, started)}"
        )
    if first:
        code = None if first.group(2) == "None" else int(first.group(2))
        return DistributedError(
            f"{w.rank} {first_rank} died: {describe_exit(code)}"
            f"{on_host(places, first_rank)}, so the job was stopped. Check its output above (lines "
            f"prefixed [{first_rank}]).{describe_death(first_rank, code, places, outputs, started)}"
        )
    if causes:
        rank = min(causes)
        return DistributedError(f"{w.rank} {rank} failed: {causes[rank]}")
    if "Spark job has failed" in text:
        return DistributedError(
            "A Spark task failed before its Horovod rank started (the Python traceback is "
            "above). Check that the executors' Python (PYSPARK_PYTHON, now "
            f"{os.environ.get('PYSPARK_PYTHON', 'python3 from PATH')!r}) has keras_dl's "
            "dependencies, Horovod included."
        )
    if TASK_TO_TASK_TIMEOUT in text:
        return DistributedError(explain_task_to_task_timeout(text))
    if "Timed out" in text or "timeout" in text.lower():
        return DistributedError(
            f"The {w.ranks} did not all start: {text.strip()} Check that the cluster has "
            "enough free task slots, or raise runtime.start_timeout."
        )
    return DistributedError(f"The {w.job} failed: {type(exc).__name__}: {text.strip()}")


def rank_outputs(logs: str) -> dict[int, list[str]]:
    """Each rank's output lines in the launcher's copy under ``logs``: a ``rank.N`` folder's
    files (the local launcher), or the lines prefixed ``[N]<stdout>:`` / ``[N]<stderr>:``
    (Spark), without the prefix."""
    outputs: dict[int, list[str]] = {}
    for f in sorted(Path(logs).rglob("*")):
        if not f.is_file():
            continue
        folder = _RANK_FOLDER_RE.fullmatch(f.parent.name)
        for line in f.read_text(errors="replace").splitlines():
            if folder:
                outputs.setdefault(int(folder.group(1)), []).append(line)
                continue
            m = _PREFIX_RE.match(line)
            if m:
                outputs.setdefault(int(m.group(1)), []).append(line[m.end() :])
    return outputs


_RANK_FOLDER_RE = re.compile(r"rank\.(\d+)")
_PREFIX_RE = re.compile(r"(?:\w{3} \w{3} +\d+ [\d:]+ \d{4})?\[(\d+)\]<std(?:out|err)>:")


def _failed(rank: int, cause: str, engine: Engine) -> str:
    return (
        f"{engine.rank} {rank} failed: {cause} (its traceback is above, lines prefixed "
        f"[{rank}]). {engine.others} were stopped."
    )


def _rebuilt_kind(exc: BaseException) -> str | None:
    """The name in ``_REBUILT`` ``exc`` travels as: its own class or its nearest base there."""
    if isinstance(exc, Preempted) or not isinstance(exc, KerasDLError):
        return None
    return next(c.__name__ for c in type(exc).__mro__ if _REBUILT.get(c.__name__) is c)


def _rebuild(rank: int, kind: str, name: str, message: str, engine: Engine) -> KerasDLError | None:
    """The error a rank reported (as ``kind``, named ``name`` in the text), or None when its
    line is not one keras_dl wrote."""
    cls = _REBUILT.get(kind)
    try:
        text = json.loads(message)
    except ValueError:
        return None
    if cls is None or not isinstance(text, str):
        return None
    return cls(_failed(rank, f"{name}: {text}", engine))
