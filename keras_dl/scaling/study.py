"""``run_study(exp, setups)``: train ``exp`` on each setup, as child runs of one parent run,
then write the study's page (:mod:`keras_dl.report.scaling`).

The driver (this process) creates the parent run (the experiment's config as its params, the
setups and the host as tags), then for each setup in order a child run tagged with its setup
and replica count, and trains it there: ``1`` and ``mirrored:N`` in a fresh process
(:mod:`keras_dl.scaling.worker`), ``np:N`` through :func:`keras_dl.launch.launch`, whose ranks
are fresh processes too. Each child gets the driver's wall-clock time to stop
(``scaling.seconds_to_stop``), its samples/s per replica and scaling efficiency; the parent gets
every setup's figures and the page, ``scaling.html``. A setup that fails stops the study: the
parent ends FAILED (KILLED on Ctrl-C) with the page of the setups that ran.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from keras_dl.config import Experiment, dumps
from keras_dl.errors import DistributedError, KerasDLError
from keras_dl.extras import import_extra
from keras_dl.report import scaling as page
from keras_dl.scaling.setups import (
    Setup,
    check_spark_master,
    parse_setup,
    setup_experiment,
    spark_master,
)
from keras_dl.scaling.worker import ERROR_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyResult:
    parent_run_id: str
    figures: list[page.SetupFigures]
    page_path: Path | None


class SetupFailed(KerasDLError):
    """A setup's training failed: the error it raised, with that error's exit code."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def run_study(exp: Experiment, setups: list[Setup], out: str | None = None) -> StudyResult:
    """Train ``exp`` on every setup in order and write the page (to ``out`` and the parent).

    Raises:
        ConfigError: ``np:N`` (N > 0) with no Spark master configured.
        DistributedError: Horovod is missing for an ``np`` setup (before any run starts).
        SetupFailed, KerasDLError: A setup's training failed (the parent ends FAILED).
    """
    from keras_dl import tracking
    from keras_dl.distribute.slots import active_session
    from keras_dl.tracking import create_run, failure_text, terminate_run

    if any(s.kind == "horovod" and s.n > 0 for s in setups):  # only those need Spark
        import_extra("pyspark", "keras-dl scaling --setups np:N with N > 0 (Spark tasks)")
        check_spark_master(setups, spark_master(active_session()))
    if any(s.kind == "horovod" for s in setups):
        from keras_dl.distribute.horovod import import_horovod

        import_horovod()  # a clear error before any run exists
    client = tracking.client(exp.tracking.uri)
    host = f"{socket.gethostname()}, {os.cpu_count()} CPUs"
    labels = ",".join(s.label for s in setups)
    tags = {"mlflow.runName": f"scaling-{exp.recipe}", page.SETUPS_TAG: labels, page.HOST_TAG: host}
    parent = create_run(exp, tags)
    uri = exp.tracking.uri
    try:
        for order, setup in enumerate(setups):
            _run_setup(exp, setup, order, parent, client)
        figures = _log_figures(client, parent)
        path = page.write_page(client, parent, out)
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        try:  # what ran is still worth a look; the page must not hide the error
            page.write_page(client, parent, out)
        except Exception as page_exc:
            log.warning("Could not write the scaling page of %s (%s).", parent, page_exc)
        terminate_run(uri, parent, status, {"keras_dl.scaling.error": failure_text(exc)})
        raise
    terminate_run(uri, parent, "FINISHED")
    return StudyResult(parent, figures, path)


def _run_setup(exp: Experiment, setup: Setup, order: int, parent: str, client) -> None:
    from keras_dl.tracking import create_run

    child_exp = setup_experiment(exp, setup)
    child = create_run(
        child_exp,
        {
            "mlflow.parentRunId": parent,
            "mlflow.runName": f"scaling-{setup.key}",
            page.SETUP_TAG: setup.label,
            page.ORDER_TAG: str(order),
            page.REPLICAS_TAG: str(setup.replicas),
        },
    )
    print(f"setup {setup.label}: run {child}", flush=True)
    start = time.monotonic()
    if setup.in_process:
        _run_worker(child_exp, setup, child, client)
    else:
        from keras_dl.launch import launch

        launch(child_exp, run_id=child)
    client.log_metric(child, page.SECONDS, time.monotonic() - start)


def _run_worker(exp: Experiment, setup: Setup, run_id: str, client) -> None:
    """``1`` or ``mirrored:N`` in a fresh process; its error raised again here."""
    from keras_dl.tracking import terminate_run

    with tempfile.TemporaryDirectory(prefix="keras_dl_scaling_") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(dumps(exp), encoding="utf-8")
        cmd = [sys.executable, "-m", "keras_dl.scaling.worker", exp.recipe, str(config), run_id]
        code = subprocess.run([*cmd, str(setup.replicas)], check=False).returncode
        error = Path(tmp) / ERROR_FILE
        message = error.read_text(encoding="utf-8") if error.exists() else None
    if code == 0:
        return
    if client.get_run(run_id).info.status == "RUNNING":  # killed before it could end its run
        terminate_run(exp.tracking.uri, run_id, "FAILED")
    if message is not None:
        raise SetupFailed(f"Setup {setup.label} failed (run {run_id}): {message}", code)
    raise DistributedError(
        f"Setup {setup.label}'s process ended with exit code {code} (run {run_id}); its output "
        "is above."
    )


def _log_figures(client, parent: str) -> list[page.SetupFigures]:
    """Each child's samples/s per replica and scaling efficiency; every setup's on the parent."""
    from keras_dl.tracking import metric

    figures = page.setup_figures(client, parent)
    base = page.baseline_of(figures)
    stamp = int(time.time() * 1000)
    on_parent = []
    for f in figures:
        values = {
            "seconds_to_stop": f.seconds,
            "val_loss": f.val_loss,
            "samples_per_sec_per_replica": f.per_replica,
            "scaling_efficiency": page.efficiency(f, base),
        }
        values = {k: v for k, v in values.items() if v is not None}
        key = parse_setup(f.label).key
        own = ("samples_per_sec_per_replica", "scaling_efficiency")  # the rest it has
        client.log_batch(
            f.run_id,
            metrics=[metric(f"scaling.{k}", values[k], stamp, 0) for k in own if k in values],
        )
        on_parent += [metric(f"{key}.{k}", v, stamp, 0) for k, v in values.items()]
    client.log_batch(parent, metrics=on_parent)
    return figures
