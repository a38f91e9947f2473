"""Refuse, before training, local folders that are not the same folder on every Spark host.

With ``runtime.np > 0`` rank 0 runs on whichever host Spark gives its task: it writes the
checkpoints in ``runtime.run_dir`` and logs the run (metrics, model) to ``tracking.uri`` and the
experiment's artifact root, from that host. A local path there (``runs/digits``,
``sqlite:///mlflow.db``, ``file:///...``) is shared only when every host mounts the same
folder at that path; a relative path is resolved in each Spark task's own working directory.

:func:`check_shared_storage` finds out rather than guesses: the driver writes a marker file
holding a random token into each such folder, then runs one barrier stage of ``np`` tasks (the
slots the ranks get, scheduled as theirs are; DataFrame API only, so classic and Spark Connect
sessions alike) in which each task reports its host name, its address and whether it reads the
same token at the same path. A host that does not is named in a :class:`ConfigError` with the
folder and the fix. Hosts where no task of the probe lands are not checked. It costs one short
Spark stage (a few seconds), and nothing when every folder is remote (``s3://``, ``abfss://``,
an MLflow server) or the master is local.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path

from keras_dl import storage
from keras_dl.errors import ConfigError, DistributedError

_SCHEMA = "task int, host string, address string, seen string"
_MARKER = ".keras_dl-shared-check-"

_FIX = {
    "run_dir": (
        "Put it on storage every host reaches: runtime.run_dir=s3://BUCKET/PATH or "
        "abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH, or an absolute path on a mount "
        "every host shares (NFS, /dbfs/...)."
    ),
    "tracking": (
        "Use a store every host reaches: an MLflow tracking server (mlflow server --host "
        "ADDRESS ...; tracking.uri=http://ADDRESS:5000), or a store on a mount every host "
        "shares (an absolute path)."
    ),
    "artifacts": (
        "Keep the artifacts where every host reaches them: tracking.artifact_location="
        "s3://BUCKET/mlflow or abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/mlflow (a new "
        "experiment: tracking.experiment=NAME), an MLflow server that serves them "
        "(mlflow server --serve-artifacts), or a mount every host shares."
    ),
}


def check_shared_storage(spark, exp) -> None:
    """Refuse ``exp``'s local run folder, tracking store or artifact root when a host of the
    cluster does not see it as the driver does (``runtime.np > 0`` only).

    Call it with the job's SparkSession once ``np`` task slots are free
    (:func:`~keras_dl.distribute.slots.wait_for_free_slots`): the probe is a barrier stage of
    ``np`` tasks. The folders are created if missing (the job would create them), and the
    markers removed after.

    Raises:
        ConfigError: Naming each such setting, the hosts that do not see its folder (name and
            address), where they looked, and the fix.
        DistributedError: When the probe's Spark stage itself fails.
    """
    if exp.runtime.np <= 0 or not exp.runtime.check_shared_storage or _local_master(spark):
        return
    folders = local_folders(exp)
    if not folders:
        return
    token = secrets.token_hex(16)
    name = _MARKER + token[:12]
    markers = []
    try:
        for _, path in folders.values():
            here = Path(path).absolute()
            here.mkdir(parents=True, exist_ok=True)
            (here / name).write_text(token)
            markers.append(here / name)
        reports = probe_hosts(spark, exp.runtime.np, folders, name, token)
    finally:
        for marker in markers:
            marker.unlink(missing_ok=True)
    problems = [_problem(key, folders[key], reports) for key in folders]
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError(
            f"runtime.np={exp.runtime.np}: rank 0 runs on whichever host of the Spark cluster "
            "its task lands on, and writes there, but "
            + " ".join(problems)
            + " (Checked by runtime.check_shared_storage: a marker file the driver wrote, read "
            "by one Spark task per rank.)"
        )


def local_folders(exp) -> dict[str, tuple[str, str]]:
    """``{kind: (setting, folder)}`` of the local folders rank 0 writes to, as the ranks see
    them (relative paths stay relative): ``run_dir``, ``tracking`` (a SQLite store's folder, a
    file store) and ``artifacts`` (a local artifact root). Remote ones are left out."""
    folders = {}
    run_dir = storage.local_path(str(exp.runtime.run_dir))
    if run_dir is not None:
        folders["run_dir"] = (f"runtime.run_dir={exp.runtime.run_dir}", run_dir)
    uri = exp.tracking.uri
    store = _store_folder(uri)
    if store is not None:
        folders["tracking"] = (f"tracking.uri={uri}", store)
    root = _artifact_root(exp, store)
    if root is not None:
        folders["artifacts"] = (f"the MLflow artifact root {root[0]}", root[1])
    return folders


def probe_hosts(spark, np: int, folders: dict, name: str, token: str) -> list[dict]:
    """Run ``np`` barrier tasks that each look for the marker ``name`` in every folder.

    Returns:
        One ``{"task", "host", "address", "seen": {kind: [found, folder as resolved there]}}``
        per task.
    """
    checks = [(key, path) for key, (_, path) in folders.items()]
    task = _probe_task(checks, name, token)
    try:
        df = spark.range(0, np, 1, np).mapInPandas(task, schema=_SCHEMA, barrier=True)
        rows = df.collect()
    except Exception as exc:
        raise DistributedError(
            f"runtime.np={np}: the check that every host shares the run's local folders (a "
            f"barrier stage of {np} Spark tasks) failed: {type(exc).__name__}: "
            f"{str(exc)[:2000]}. Fix the cluster, or skip the check with "
            "runtime.check_shared_storage=false if every host mounts those folders."
        ) from exc
    return [{**r.asDict(), "seen": json.loads(r.seen)} for r in sorted(rows, key=lambda r: r.task)]


# -- private helpers ---------------------------------------------------------------------------


def _probe_task(checks: list, name: str, token: str):
    """The function each probe task runs: stdlib and pyspark only (pickled by value)."""

    def task(batches):
        import json
        import os
        import socket

        import pandas as pd
        from pyspark import BarrierTaskContext

        for _ in batches:  # one row per task; the stage needs its input consumed
            pass
        ctx = BarrierTaskContext.get()
        address = ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
        seen = {}
        for key, path in checks:
            try:
                with open(os.path.join(path, name)) as f:
                    found = f.read() == token
            except OSError:
                found = False
            seen[key] = [found, os.path.abspath(path)]
        row = {"task": ctx.partitionId(), "host": socket.gethostname(), "address": address}
        yield pd.DataFrame([{**row, "seen": json.dumps(seen)}])

    return task


def _problem(key: str, folder: tuple[str, str], reports: list[dict]) -> str:
    """The sentence for one setting whose folder some hosts do not see; "" when all do."""
    setting, path = folder
    missed: dict[tuple[str, str], str] = {}
    for r in reports:
        found, there = r["seen"][key]
        if not found:
            missed.setdefault((r["host"], r["address"]), there)
    if not missed:
        return ""
    hosts = "; ".join(
        f"host {host} ({address}) did not find it in {there}"
        for (host, address), there in missed.items()
    )
    return (
        f"{setting} is not the same folder on every host: the driver on host "
        f"{socket.gethostname()} wrote a marker file in {os.path.abspath(path)}, and the Spark "
        f"task on {hosts}. {_FIX[key]}"
    )


def _store_folder(uri: str) -> str | None:
    """The local folder of a SQLite or file tracking store; None for a server or other scheme."""
    if uri.startswith("sqlite:///"):
        return os.path.dirname(uri[len("sqlite:///") :]) or "."
    if uri.startswith("file:"):
        return uri[len("file://") :] if uri.startswith("file://") else uri[len("file:") :]
    if not uri or uri.startswith("databricks") or ":" in uri:
        return None  # a workspace, a server or another scheme: not a folder of this host
    return uri  # a plain path: MLflow's file store


def _artifact_root(exp, store: str | None) -> tuple[str, str] | None:
    """``(URI, local folder)`` of the experiment's artifact root when it is local; else None.

    ``tracking.artifact_location`` when set; else, for a SQLite store, the existing
    experiment's location (read from the store) or ``mlartifacts/`` beside the database, as
    :func:`keras_dl.tracking.setup_mlflow` creates it. A file store keeps its artifacts
    inside its own folder (checked as the store); a server's are the server's (not checked).
    """
    uri = exp.tracking.artifact_location
    if not uri and exp.tracking.uri.startswith("sqlite:///"):
        uri = _existing_location(exp) or Path(store, "mlartifacts").absolute().as_uri()
    if not uri:
        return None
    path = storage.local_path(uri)
    return (uri, path) if path is not None else None


def _existing_location(exp) -> str | None:
    """The artifact location of ``tracking.experiment`` in an existing SQLite store, if any."""
    db = Path(exp.tracking.uri[len("sqlite:///") :])
    if not db.is_file():
        return None
    from keras_dl import tracking

    found = tracking.client(exp.tracking.uri).get_experiment_by_name(exp.tracking.experiment)
    return found.artifact_location if found is not None else None


def _local_master(spark) -> bool:
    """Whether every task runs on this host: a ``local[...]`` master (classic or Connect)."""
    try:
        master = spark.conf.get("spark.master", None) or ""
    except Exception:  # a Connect server that does not show it
        return False
    return master.startswith("local")
