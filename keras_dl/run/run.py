"""One training run: its folder, its lock or lease, and its MLflow run, from start to end.

``fit``, the Horovod launcher and the Spark estimator all open a run the same way::

    with open_run(exp) as run:  # the chief takes runtime.run_dir's lock or lease
        data = ...  # read the table
        run.start(tags=data.snapshot.lineage)  # config.yaml, the MLflow run, run.json
        ...  # train: callbacks read run.run_id, run.folder, run.exp
    # the MLflow run ends FINISHED, or FAILED / KILLED (preempted) with the cause as tags,
    # and the lock is released

Only the chief writes: on other ranks :meth:`Run.start` returns None and nothing is ended.
The launcher's driver opens the run with ``driver=True``: it creates the MLflow run without
activating it, passes its id to the ranks (rank 0 attaches, and ends it FINISHED), and ends
it itself only when the job fails or is preempted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from keras_dl import tracking
from keras_dl.distribute.world import World, current_world
from keras_dl.errors import Preempted
from keras_dl.run.folder import RunFolder
from keras_dl.run.resume import resume_run_id
from keras_dl.runlock import held_by_launcher, open_run_lock
from keras_dl.storage import watchdog

log = logging.getLogger(__name__)


def _answers(uri: str) -> bool:
    return tracking.is_reachable(uri)[0]


class Run:
    """A training run (see the module's docstring). Use :func:`open_run` to make one."""

    def __init__(
        self,
        exp,
        world: World,
        attach: str | None = None,
        lock_run_dir: bool | None = None,
        driver: bool = False,
    ):
        self.exp = exp
        self.world = world
        self.folder = RunFolder(exp.runtime.run_dir)
        self.run_id: str | None = None
        self._unwatch = lambda: None
        self.driver = driver
        self._attach = attach
        self._launched = held_by_launcher(exp.runtime.run_dir)  # a rank: its driver ends a failure
        if lock_run_dir is None:  # a rank whose launcher holds the lock does not take it
            lock_run_dir = not self._launched
        self._lock = (
            open_run_lock(exp.runtime.run_dir, exp.runtime.lease_seconds)
            if world.is_chief and lock_run_dir
            else None
        )

    def __repr__(self) -> str:
        return f"Run({self.folder.uri!r}, run_id={self.run_id!r})"

    def __enter__(self) -> Run:
        if self._lock is not None:
            self._lock.acquire()  # before anything is written: a second run stops here
        return self

    def start(self, tags: Mapping[str, str] = ()) -> str | None:
        """Record the config, create or attach the MLflow run, and record its id.

        The MLflow run is, in this order: the one given to :func:`open_run`, the interrupted
        one this folder continues (:func:`~keras_dl.run.resume.resume_run_id`), or a new one
        with the config as params and the ``config.yaml`` artifact.

        Returns:
            The MLflow run id on the chief; None on other ranks.
        """
        if not self.world.is_chief:
            return None
        exp = self.exp
        self.folder.remove_temporaries()  # first: a killed writer's leftovers may fill the disk
        self.folder.record_config(exp)
        tracking.check_reachable(exp.tracking.uri)  # MLflow would retry for minutes
        attach = self._attach or resume_run_id(exp, self.folder)
        if self.driver:
            self.run_id = attach or tracking.create_run(exp, tags)
        else:
            self.run_id = tracking.start_run(exp, tags, run_id=attach)
        self.folder.record_run_id(self.run_id, exp.tracking.uri)
        if self._lock is not None:
            self._lock.update(self.run_id)  # a second run's error names it
        # A store call hung past the lease: the watchdog (the CLI's) ends the process, this
        # run KILLED first, as a StoreUnavailable raised in time would.
        self._unwatch = watchdog.on_expiry(self._killed_by_store)
        return self.run_id

    def _killed_by_store(self, error: BaseException) -> None:
        tags = {tracking.PREEMPTED_TAG: "STORE_UNAVAILABLE", **tracking.failure_tags(error)}
        tracking.terminate_run(self.exp.tracking.uri, self.run_id, "KILLED", tags)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tag the active MLflow run (the chief's)."""
        tracking.set_tags(dict(tags))

    def log_params(self, params: Mapping[str, object]) -> None:
        """Log params to the active MLflow run (the chief's)."""
        tracking.log_params(dict(params))

    def end(self, error: BaseException | None = None) -> None:
        """End the MLflow run: FINISHED, KILLED for :class:`Preempted`, else FAILED.

        The driver of a launched job leaves a FINISHED end to rank 0, which holds the run.
        """
        if not self.world.is_chief or self.run_id is None:
            return
        if isinstance(error, Preempted):  # not FAILED: nothing is wrong, rerunning resumes
            status, tags = "KILLED", {tracking.PREEMPTED_TAG: error.signal_name}
            if not self.driver:  # the rank that stopped says where (the driver only which signal)
                tags.update(tracking.failure_tags(error))
        elif error is not None:
            status, tags = "FAILED", tracking.failure_tags(error)
        elif self.driver:
            return
        else:
            status, tags = "FINISHED", {}
        if self.driver:
            tracking.terminate_run(self.exp.tracking.uri, self.run_id, status, tags)
        elif error is not None and self._launched and not _answers(self.exp.tracking.uri):
            # A rank cut off the tracking server (its host alone, say): MLflow would retry for
            # minutes while the job waits; the driver ends the run with the job's error.
            log.warning(
                "MLflow at %s is not answering: the driver ends the run.", self.exp.tracking.uri
            )
        else:
            tracking.end_run(status, tags=tags)

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._unwatch()
        try:
            self.end(exc)
        finally:
            if self._lock is not None:
                self._lock.release()
        return False


def open_run(
    exp,
    world: World | None = None,
    run_id: str | None = None,
    lock_run_dir: bool | None = None,
    driver: bool = False,
) -> Run:
    """The :class:`Run` of ``exp``, to use as a context manager.

    Args:
        exp: The resolved experiment (``runtime.run_dir`` is the run folder).
        world: This process's world. Defaults to :func:`current_world`.
        run_id: An MLflow run to attach to (a launcher's, or an estimator's to continue).
            Defaults to None: the interrupted run the folder continues, else a new one.
        lock_run_dir: Take the folder's lock or lease on the chief. Defaults to None: yes,
            unless this is a rank whose launcher holds it.
        driver: This is a launcher's driver (see the module's docstring).
    """
    return Run(exp, world or current_world(), run_id, lock_run_dir, driver)
