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
from collections import defaultdict
from datetime import datetime, timezone
from html import escape
from pathlib import Path

from keras_dl.report.page import line_chart, page, section, table
from keras_dl.run import tracking

log = logging.getLogger(__name__)

ARTIFACT = "report.html"
MAX_POINTS = 500
FAILED_TAG = "keras_dl.report_failed"  # why the last attempt to build the report failed
SPEED = ("samples_per_sec", "steps_per_sec")  # Throughput's, per epoch (steps/s: no batch size)
WAIT = ("input_wait_fraction", "input_wait_ms")
# Evaluation metrics beside the learning curves' names: the whole split of a run on the
# changed rows (finish's full_test_*, the gate's full_val_*) and the champion's (the gate's).
ONE_VALUE = ("test_", "full_test_", "full_val_", "champion_")
LINEAGE_TAGS = ("data.table", "data.format", "data.version", "data.since_version")
LINEAGE_PARAMS = (
    "data.version_range",
    "data.rows_trained_per_epoch",
    "data.padded_rows_per_epoch",
    "data.train_rows",
    "data.files",
    "train.steps_per_epoch",
    "train.epochs",
    "train.batch_size",
)


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
        import mlflow

        log_report(run.run_id, run.exp.tracking.uri or mlflow.get_tracking_uri())


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
    history = {k: _history(client, run_id, k) for k in run.data.metrics}
    learning = {
        k: v
        for k, v in history.items()
        if "." not in k  # early_stopping.best, data.bad_images_skipped: one value, no curve
        and not k.startswith(("system/", "step_", *ONE_VALUE, *SKIP_PREFIXES))
        and not k.startswith(tuple(f"val_{p}" for p in SKIP_PREFIXES))
    }
    sections = [
        _header(run),
        section("Learning curves", _learning_charts(learning), "curves"),
        section("Throughput", _throughput_charts(history), "throughput"),
        section("System metrics per rank", _system_charts(history), "system"),
        section("Data lineage", _lineage(run), "lineage"),
        section("Registry decision", _registry(client, run), "registry"),
        section("Final metrics", table(sorted(_final_metrics(run).items())), "final"),
        f"<details><summary>Parameters ({len(run.data.params)})</summary>"
        f"{table(sorted(run.data.params.items()))}</details>",
    ]
    return page(f"{run.info.run_name or run_id} - keras_dl run report", sections)


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
def _header(run) -> str:
    info, tags = run.info, run.data.tags
    started = (
        datetime.fromtimestamp(info.start_time / 1000, timezone.utc) if info.start_time else None
    )
    rows = [
        ("run", f"{info.run_name} ({info.run_id})"),
        ("experiment id", info.experiment_id),
        ("recipe", tags.get("keras_dl.recipe", "")),
        ("status", info.status),
        ("started", f"{started:%Y-%m-%d %H:%M:%S} UTC" if started else ""),
        ("commit", tags.get("mlflow.source.git.commit", tags.get("git.commit", ""))),
    ]
    failure = tags.get(tracking.FAILURE_TAG)
    if failure:
        rows.append(("failure", f"{failure}: {tags.get(tracking.FAILURE_REASON_TAG, '')}"))
    return f"<h1>Run report</h1>{table([r for r in rows if r[1]])}"


def _learning_charts(learning: dict) -> str:
    names = sorted({k.removeprefix("val_") for k in learning})
    charts = []
    for name in names:
        series = {k: _epochs(learning[k]) for k in (name, f"val_{name}") if k in learning}
        charts.append(line_chart(name, series, dashed=[f"val_{name}"]))
    return "".join(charts)


def _throughput_charts(history: dict) -> str:
    charts = []
    for title, keys in (("samples per second", SPEED), ("input wait", WAIT)):
        key = next((k for k in keys if k in history), None)
        if key is not None:
            values = _epochs(history[key])
            if key == "input_wait_fraction":  # a share of step time: shown as percent
                key, values = "input wait (% of step time)", [(x, 100 * y) for x, y in values]
            charts.append(line_chart(title, {key: values}))
    return "".join(charts)


def _system_charts(history: dict) -> str:
    """One chart per system metric, one line per rank, against seconds since the first sample."""
    by_name: dict[str, dict[str, list]] = defaultdict(dict)
    for key, points in history.items():
        parts = key.split("/", 2)  # system/rank_1/cpu_percent
        if len(parts) == 3 and parts[0] == "system":
            by_name[parts[2]][parts[1]] = points
    stamps = [t for ranks in by_name.values() for pts in ranks.values() for _, _, t in pts]
    t0 = min(stamps, default=0)
    charts = []
    for name in sorted(by_name):
        ranks = by_name[name]
        order = sorted(ranks, key=lambda r: (len(r), r))  # rank_2 before rank_10
        # At most MAX_POINTS a line: a day at 10 s is 8,640 samples a rank, more than a chart shows.
        series = {r: [((t - t0) / 1000, v) for _, v, t in _thin(ranks[r])] for r in order}
        charts.append(line_chart(name, series, xlabel="seconds"))
    return "".join(charts)


def _lineage(run) -> str:
    tags, params = run.data.tags, run.data.params
    rows = [(k, tags[k]) for k in LINEAGE_TAGS if tags.get(k)]
    rows += [(k, params[k]) for k in LINEAGE_PARAMS if k in params]
    rows += sorted(
        (k, v)
        for k, v in params.items()
        if k.startswith("data.") and k.endswith(("_scanned", "_kept", "_skipped"))
    )
    datasets = []
    for d in getattr(run.inputs, "dataset_inputs", None) or []:
        context = next((t.value for t in d.tags if t.key == "mlflow.data.context"), "")
        datasets.append(
            (d.dataset.name, context, _profile_rows(d.dataset.profile), d.dataset.digest)
        )
    out = table(rows)
    if datasets:
        out += table(datasets, head=("dataset", "split", "rows", "digest"))
    return out


def _registry(client, run) -> str:
    tags = run.data.tags
    versions = _model_versions(client, run.info.run_id)
    refused = tags.get(tracking.NOT_REGISTERED_TAG)
    if versions:
        decision = "registered: " + ", ".join(f"{v.name} version {v.version}" for v in versions)
    elif refused:
        decision = refused
    elif tracking.GATE_TAG in tags:
        decision = "passed the gate; no registered version found"
    else:
        decision = "no registry decision (registration off, or the run ended before it)"
    verdict = "refused" if refused and not versions else ("passed" if versions else "none")
    rows = [("decision", decision), ("gate checked", tags.get(tracking.GATE_TAG, ""))]
    out = f'<p class="verdict {verdict}">{escape(verdict)}</p>' + table([r for r in rows if r[1]])
    return out + _comparison(run.data.metrics)


def _comparison(metrics: dict) -> str:
    """This model beside the champion (``registry.must_beat``), metric by metric: on the
    evaluation rows (the changed rows of a ``data.since_version`` run) and, for such a run, on
    the whole split at the same version, where a model that forgot the older rows loses."""
    for rows, whole in (("test_", "full_test_"), ("val_", "full_val_")):
        keys = [k for k in metrics if k.startswith((whole, f"champion_{rows}"))]
        if keys:
            break
    else:
        return ""
    names = sorted({k.split(rows, 1)[1] for k in keys})
    changed = any(k.startswith(whole) for k in keys)
    where = "changed rows" if changed else rows.rstrip("_") + " rows"
    split = "test" if rows == "test_" else "validation"
    head = ("metric", f"this model, {where}", f"champion, {where}")
    if changed:
        head += (f"this model, whole {split} split", f"champion, whole {split} split")
    cells = []
    for name in names:
        keys = (rows, f"champion_{rows}", whole, f"champion_{whole}")[: len(head) - 1]
        cells.append((name, *(_figure(metrics.get(k + name)) for k in keys)))
    return table(cells, head=head)


# -- helpers ----------------------------------------------------------------------------------
def _client(tracking_uri: str | None):
    import mlflow

    from keras_dl.config import default_tracking_uri

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    return mlflow.MlflowClient(uri)


def _history(client, run_id: str, key: str) -> list[tuple[int, float, int]]:
    """``(step, value, timestamp)`` by step; a step logged twice (a resumed run) keeps the last."""
    latest: dict[int, tuple[int, float, int]] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
        latest[m.step] = (m.step, m.value, m.timestamp)
    return [latest[s] for s in sorted(latest)]


def _thin(points: list) -> list:
    """MAX_POINTS evenly spread points, the first and the last among them."""
    n = len(points)
    return (
        points
        if n <= MAX_POINTS
        else [points[i * (n - 1) // (MAX_POINTS - 1)] for i in range(MAX_POINTS)]
    )


def _epochs(points) -> list[tuple[float, float]]:
    return [(step + 1, value) for step, value, _ in points]  # epochs counted from 1


def _final_metrics(run) -> dict[str, str]:
    """The test split's scores and the one-value metrics (``early_stopping.best``)."""
    return {k: f"{v:.6g}" for k, v in run.data.metrics.items() if k.startswith("test_") or "." in k}


def _figure(value) -> str:
    return "" if value is None else f"{value:.6g}"


def _model_versions(client, run_id: str) -> list:
    try:
        return list(client.search_model_versions(f"run_id = '{run_id}'"))
    except Exception:  # a store without a registry
        return []


def _profile_rows(profile: str | None) -> str:
    import json

    try:
        return str(json.loads(profile or "{}").get("num_rows", ""))
    except ValueError:
        return ""
