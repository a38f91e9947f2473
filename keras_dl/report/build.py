"""keras-dl report RUN_ID: (re)write a run's report.html, one page to look at instead of numbers.

The report is built from the finished run through ``MlflowClient`` alone (never from the
process's memory), so it is the same for a single process, a resumed run and a Horovod job where
only rank 0 logs. It shows the learning curves (train and validation, per epoch), samples/s and
the input wait per epoch, every rank's system metrics, the data lineage (table, version or
version range, rows trained per epoch, the datasets of each split) and the registry decision
with its reason. It is one self-contained HTML file: inline SVG (:mod:`keras_dl.report.page`), no
script, nothing fetched, every value from the run HTML-escaped.

:func:`log_report` runs where a training ends (after the registry gate, passed or refused) and
never fails it: an error is logged as a warning and tagged ``keras_dl.report_failed``.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

from keras_dl import tracking
from keras_dl.report import sections
from keras_dl.report.page import page, section, table

log = logging.getLogger(__name__)

ARTIFACT = "report.html"
FAILED_TAG = "keras_dl.report_failed"  # why the last attempt to build the report failed
# Evaluation metrics beside the learning curves' names: the whole split of a run on the
# changed rows (finish's full_test_*, the gate's full_val_*) and the champion's (the gate's).
ONE_VALUE = ("test_", "full_test_", "full_val_", "champion_")


def log_report(run_id: str, tracking_uri: str | None = None) -> Path | None:
    """Build the report of ``run_id`` and log it as its ``report.html``; never raises.

    Returns:
        The local copy's path, or None when building or logging it failed (warned and tagged).
    """
    try:
        if tracking_uri:  # a server that went away: fail in one request, not minutes of retries
            tracking.check_reachable(tracking_uri)
        return write_report(run_id, tracking_uri)
    except Exception as exc:  # a report is a view of the run: never fail the run for it
        log.warning("Could not build the run report of %s (%s).", run_id, exc)
        try:
            _client(tracking_uri).set_tag(run_id, FAILED_TAG, tracking.failure_text(exc))
        except Exception:
            pass
        return None


def log_run_report(run) -> None:
    """The report of a :class:`~keras_dl.run.Run` that has just ended (FINISHED, or FAILED with
    its cause), on the chief; never raises. A preempted run is left without one until it has
    resumed and ended."""
    if run.world.is_chief and run.run_id is not None:
        log_report(run.run_id, run.exp.tracking.uri or tracking.tracking_uri())


def write_report(run_id: str, tracking_uri: str | None = None, out: str | None = None) -> Path:
    """Build the report of ``run_id``, log it as the run's ``report.html`` and return the local
    file (``out``, or one in a temporary folder). Raises what MLflow raises."""
    client = _client(tracking_uri)
    page = render(client, run_id)
    path = Path(out) if out else Path(tempfile.mkdtemp(prefix="keras_dl_report_")) / ARTIFACT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    if path.name == ARTIFACT:
        client.log_artifact(run_id, str(path))
    else:  # the artifact keeps its name whatever the local copy is called
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / ARTIFACT).write_text(page, encoding="utf-8")
            client.log_artifact(run_id, str(Path(tmp) / ARTIFACT))
    if FAILED_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, FAILED_TAG)  # an earlier attempt's failure no longer holds
    return path


def render(client, run_id: str) -> str:
    """The report of ``run_id`` as one HTML page (see the module's docstring)."""
    from keras_dl.callbacks.plots import SKIP_PREFIXES

    run = client.get_run(run_id)
    history = {k: metric_history(client, run_id, k) for k in run.data.metrics}
    learning = {
        k: v
        for k, v in history.items()
        if "." not in k  # early_stopping.best, data.bad_images_skipped: one value, no curve
        and not k.startswith(("system/", "step_", *ONE_VALUE, *SKIP_PREFIXES))
        and not k.startswith(tuple(f"val_{p}" for p in SKIP_PREFIXES))
    }
    parts = [
        sections.header(run),
        section("Learning curves", sections.learning_charts(learning), "curves"),
        section("Throughput", sections.throughput_charts(history), "throughput"),
        section("System metrics per rank", sections.system_charts(history), "system"),
        section("Data lineage", sections.lineage(run), "lineage"),
        section("Registry decision", sections.registry(client, run), "registry"),
        section("Final metrics", table(sorted(sections.final_metrics(run).items())), "final"),
        f"<details><summary>Parameters ({len(run.data.params)})</summary>"
        f"{table(sorted(run.data.params.items()))}</details>",
    ]
    return page(f"{run.info.run_name or run_id} - keras_dl run report", parts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl report`` arguments."""
    p.add_argument("run_id", help="the MLflow run whose report.html to (re)write")
    p.add_argument("--out", help="also keep the page at this path (default: a temporary folder)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )


def run(args: argparse.Namespace) -> int:
    """``keras-dl report``: rewrite the run's report.html and print where it is."""
    path = write_report(args.run_id, args.tracking_uri, args.out)
    print(f"{ARTIFACT} logged to run {args.run_id}; local copy: {path}")
    return 0


# -- sections ---------------------------------------------------------------------------------


# -- helpers ----------------------------------------------------------------------------------
def _client(tracking_uri: str | None):
    from keras_dl.config import default_tracking_uri

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    return tracking.client(uri)


def metric_history(client, run_id: str, key: str) -> list[tuple[int, float, int]]:
    """``(step, value, timestamp)`` by step; a step logged twice (a resumed run) keeps the last."""
    latest: dict[int, tuple[int, float, int]] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
        latest[m.step] = (m.step, m.value, m.timestamp)
    return [latest[s] for s in sorted(latest)]
