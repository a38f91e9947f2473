"""Errors a user can act on.

Every error raised for bad input is a :class:`KerasDLError`. The CLI prints its message as one
paragraph and exits non-zero; library callers catch it like any exception. The message names the
table, file, column or key at fault and says how to fix it.
"""

from __future__ import annotations


class KerasDLError(Exception):
    """A problem with the user's input or environment, explained in the message."""

    exit_code = 2  # the CLI's exit status for this error


class DivergenceError(KerasDLError):
    """Training diverged: a loss, metric or weight became NaN or infinite.

    Not retried by automatic recovery: the same settings would diverge again.
    """

    exit_code = 3


class NotRegistered(KerasDLError):
    """Training finished, but the model did not earn registration (see :mod:`keras_dl.model.gate`).

    Raised by the CLI after the run ended FINISHED with the reason as its
    ``keras_dl.not_registered`` tag; everything but the registry entry was logged.
    """

    exit_code = 4


class ConfigError(KerasDLError, ValueError):
    """An unknown config key, a badly typed value, or an inconsistent setting."""


class DataError(KerasDLError):
    """A table, file, column or row group that cannot be read as asked."""


class RunError(KerasDLError):
    """The run folder (``runtime.run_dir``) cannot take a write: a full disk, a quota."""


class SparkConnectError(KerasDLError):
    """A feature a Spark Connect session (no SparkContext, no JVM on the client) cannot give."""


class DistributedError(KerasDLError):
    """A distributed setup that cannot run (too few shards, missing Horovod, no free slots...)."""


PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again later"; distinct from errors (1-4) and signals


class Preempted(KerasDLError):
    """Training stopped on SIGTERM or SIGINT after checkpointing; rerun to resume.

    Attributes:
        signal_name: "SIGTERM" or "SIGINT" (the first one received on any rank).
        global_step: Training steps completed and checkpointed.
    """

    exit_code = PREEMPTED_EXIT

    def __init__(self, signal_name: str, global_step: int):
        super().__init__(
            f"Preempted by {signal_name}: stopped after step {global_step}, which is "
            "checkpointed. Run the same command again to resume from it."
        )
        self.signal_name = signal_name
        self.global_step = global_step

    def __reduce__(self):  # picklable with its two arguments (Horovod returns it from ranks)
        return (type(self), (self.signal_name, self.global_step))


class HostLost(Preempted):
    """A rank's host stopped answering mid-job (its network or machine gone): the job was ended,
    and a rerun resumes from the last checkpoint, on the hosts left.

    Like :class:`Preempted` it exits 75 and ends the run KILLED: the run is not at fault.

    Attributes:
        rank: The rank that was lost.
        host: Its host, as the driver knew it.
        waited: Seconds the driver waited for it to stop after the job's first failure.
    """

    def __init__(
        self,
        rank: int,
        host: str,
        waited: float,
        worker: str = "Horovod rank",
        silence: str | None = None,
    ):
        """``worker``: what the engine calls a process ("Horovod rank", "Multi-worker worker");
        ``silence``: the evidence that it stopped answering, and what that says (Horovod's:
        its task service did not respond)."""
        silence = silence or (
            f"its task service did not respond for {waited:.0f} s after the job's first "
            "failure, so its host or the network to it is gone"
        )
        KerasDLError.__init__(
            self,
            f"{worker} {rank} on host {host} stopped answering: {silence}. The job was ended; "
            "nothing is lost: run the same command "
            "again to resume from the last checkpoint, on the hosts left (a smaller "
            "runtime.np if the cluster now has fewer task slots).",
        )
        self.rank, self.host, self.waited = rank, host, waited
        self.worker, self.silence = worker, silence
        self.signal_name = "HOST_LOST"
        self.global_step = -1

    def __reduce__(self):
        return (type(self), (self.rank, self.host, self.waited, self.worker, self.silence))


class StoreUnavailable(Preempted):
    """The object store stayed unreachable past the run's lease: stopped, rerun to resume.

    Raised by :func:`keras_dl.storage.retry.retrying` after it retried a transient store error
    (timeout, refused connection, HTTP 5xx) until the time the run's lease stays valid. Like
    :class:`Preempted` it exits 75 and ends the run KILLED: nothing is wrong with the run, and
    running the same command again once the store is back resumes from the last checkpoint.

    Attributes:
        store: The store, e.g. ``s3://lake``.
        waited: Seconds it was retried.
    """

    def __init__(self, store: str, waited: float, leased: bool = True, cause: object = None):
        limit = (
            "the time the run's lease on runtime.run_dir stays valid (runtime.lease_seconds)"
            if leased
            else "the time keras_dl waits for a store when no run lease sets it"
        )
        KerasDLError.__init__(
            self,
            f"Object store {store} unreachable for {waited:.0f} s, longer than {limit}: "
            f"training stopped (last error: {_first_line(cause)}). "
            "Nothing is lost: run the same command again once the store is back, and it resumes "
            "from the last checkpoint. To ride out longer outages, raise runtime.lease_seconds.",
        )
        self.store, self.waited, self.leased, self.cause = store, waited, leased, cause
        self.signal_name = "STORE_UNAVAILABLE"
        self.global_step = -1

    def __reduce__(self):
        return (type(self), (self.store, self.waited, self.leased, str(self.cause)))


def _first_line(cause: object) -> str:
    text = str(cause).strip().splitlines()
    return text[0][:300] if text else type(cause).__name__
