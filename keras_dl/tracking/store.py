"""The tracking store: pointing MLflow at it (and checking it answers), the tags keras_dl sets
on a run, and the ``mlflow ui`` hint. The MLflow run itself is :mod:`keras_dl.tracking.mlflow_run`.

Only the chief calls these. The default store is a SQLite file in the working directory, with
artifacts in ``mlartifacts/`` next to it, so a run is self-contained on a laptop or in a test.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from keras_dl import storage
from keras_dl.config import Experiment, to_dict
from keras_dl.errors import ConfigError, DivergenceError

log = logging.getLogger(__name__)


def setup_mlflow(uri: str, experiment: str, artifact_location: str = "") -> str:
    """Point MLflow at ``uri`` and make sure ``experiment`` exists; return its id.

    Args:
        uri: The tracking URI.
        experiment: The experiment name.
        artifact_location: Where a new experiment keeps its artifacts (e.g.
            ``s3://bucket/mlflow``). Defaults to "": for a SQLite URI, ``mlartifacts/`` beside
            the database, otherwise the store's default.

    Raises:
        ConfigError: When the store cannot be reached, the experiment is deleted, or it exists
            with an artifact location other than ``artifact_location``.
    """
    import mlflow

    # MLflow's S3 artifact store takes its endpoint from MLFLOW_S3_ENDPOINT_URL (set from
    # AWS_ENDPOINT_URL when unset); the other AWS variables it reads as they are.
    storage.use_environment(storage.environment())
    check_reachable(uri)
    create_store(uri)
    mlflow.set_tracking_uri(uri)
    existing = mlflow.get_experiment_by_name(experiment)
    if existing is not None and existing.lifecycle_stage == "deleted":
        raise ConfigError(
            f"MLflow experiment {experiment!r} (id {existing.experiment_id}) in {uri} is deleted, "
            "so no run can start in it. Restore it (MLFLOW_TRACKING_URI="
            f"{uri} mlflow experiments restore --experiment-id {existing.experiment_id}), or "
            "train into another experiment with --set tracking.experiment=NAME."
        )
    if existing is not None:
        if artifact_location and _location(existing.artifact_location) != _location(
            artifact_location
        ):
            raise ConfigError(
                f"MLflow experiment {experiment!r} in {uri} keeps its artifacts in "
                f"{existing.artifact_location}, not tracking.artifact_location="
                f"{artifact_location}: an experiment's artifact location cannot change. Drop "
                "the setting to use the existing location, or train into a new experiment "
                "with --set tracking.experiment=NAME."
            )
        return existing.experiment_id
    location = artifact_location or None
    if location is None and uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        location = (db.parent / "mlartifacts").absolute().as_uri()
    try:
        return mlflow.create_experiment(experiment, artifact_location=location)
    except Exception:  # created concurrently by another process
        return mlflow.get_experiment_by_name(experiment).experiment_id


def create_store(uri: str) -> None:
    """Create (migrate) a SQLite tracking store under a file lock, once.

    MLflow builds a new SQLite store with Alembic migrations on first use; two processes doing
    that at once (two runs, or a driver and a rank) fail with "table ... already exists" or
    "duplicate column" (7 of 9 processes here). The first takes the lock and migrates; the
    others wait, then find the store built.
    """
    if not uri.startswith("sqlite:///"):
        return
    import fcntl

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            SqlAlchemyStore(uri, (db.parent / "mlartifacts").absolute().as_uri())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_reachable(uri: str) -> None:
    """Fail fast, with the fix, when the tracking store at ``uri`` cannot be used.

    MLflow itself retries an unreachable server for minutes before it gives up; a tracking
    server gets one ``/health`` request here, a SQLite store a check that its folder exists.

    Raises:
        ConfigError: Naming ``tracking.uri`` and the reason.
    """
    fix = (
        "Start the server or fix tracking.uri, or track locally with "
        "--set tracking.uri=sqlite:///mlflow.db."
    )
    if uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///") :]).parent
        if not folder.is_dir():
            raise ConfigError(
                f"tracking.uri={uri} points into {folder}, which does not exist. Create it or "
                "point tracking.uri at an existing folder."
            )
        return
    if not uri.startswith(("http://", "https://")):
        return  # databricks, file stores...: MLflow's own errors are quick there
    import requests

    try:
        answered = requests.get(uri.rstrip("/") + "/health", timeout=5.0).ok
        reason = "" if answered else "its /health check failed"
    except requests.RequestException as exc:
        answered, reason = False, str(exc)
    if not answered:
        raise ConfigError(f"tracking.uri={uri} cannot be reached ({reason}). {fix}")


FAILURE_TAG = "keras_dl.failure"
FAILURE_REASON_TAG = "keras_dl.failure_reason"  # the message, where the failure tag is a kind
NOT_REGISTERED_TAG = "keras_dl.not_registered"  # why a FINISHED run's model was not registered
GATE_TAG = "keras_dl.gate"  # what the registry gate checked, passed or not
PREEMPTED_TAG = "preempted"  # the signal that stopped a run marked KILLED


def failure_tags(reason: BaseException | str) -> dict[str, str]:
    """The tags of a run that failed for ``reason``: ``keras_dl.failure`` is the cause as
    ``Type: message``, or ``diverged`` (a kind to filter on, with the message in
    ``keras_dl.failure_reason``) when training diverged."""
    if isinstance(reason, DivergenceError):
        return {FAILURE_TAG: "diverged", FAILURE_REASON_TAG: failure_text(reason)}
    return {FAILURE_TAG: failure_text(reason)}


def failure_text(reason: BaseException | str) -> str:
    """``Type: message`` of an exception (or the text as is), within MLflow's tag limit."""
    if isinstance(reason, BaseException):
        reason = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    return reason[:5000]


def describe_version(exp: Experiment, lineage: Mapping[str, str], metrics: Mapping) -> str:
    """A registered version's description: what it was trained on, its metrics, its config."""
    import yaml

    scores = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())) or "none"
    return (
        f"Recipe {exp.recipe} trained on {lineage.get('data.table')} "
        f"(version {lineage.get('data.version') or 'n/a'}), git commit "
        f"{git_tags().get('mlflow.source.git.commit', 'unknown')}. Test metrics: {scores}.\n\n"
        f"Resolved config (also config.yaml in the run's artifacts):\n\n"
        + yaml.safe_dump(to_dict(exp), sort_keys=False)
    )


def ui_command(uri: str) -> str:
    """The shell command that opens the MLflow UI on ``uri``."""
    if uri.startswith("sqlite:///"):
        rel = os.path.relpath(uri[len("sqlite:///") :])
        uri = f"sqlite:///{rel}" if not rel.startswith("..") else uri
    return f"{_mlflow_script()} ui --backend-store-uri {uri} --port 5000"


def _mlflow_script() -> str:
    """The ``mlflow`` command of this environment: beside this interpreter (relative to the
    working folder when inside it, as ``.venv/bin/mlflow`` in a checkout), else from PATH."""
    script = os.path.join(os.path.dirname(sys.executable), "mlflow")
    if not os.path.exists(script):
        return "mlflow"
    if shutil.which("mlflow") == script:
        return "mlflow"  # what the shell runs already
    rel = os.path.relpath(script)
    return rel if not rel.startswith("..") else script


def git_tags() -> dict[str, str]:
    """``mlflow.source.git.commit`` for the code's git checkout, when there is one."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"mlflow.source.git.commit": commit} if commit else {}


def _location(uri: str) -> str:
    """An artifact location as compared: no trailing slash, local paths absolute."""
    local = storage.local_path(uri)
    return os.path.abspath(local) if local is not None else uri.rstrip("/")
