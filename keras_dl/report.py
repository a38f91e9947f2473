"""keras-dl report RUN_ID: (re)write a run's report.html, one page to look at instead of numbers.

The report is built from the finished run through ``MlflowClient`` alone (never from the
process's memory), so it is the same for a single process, a resumed run and a Horovod job where
only rank 0 logs. It shows the learning curves (train and validation, per epoch), samples/s and
the input wait per epoch, every rank's system metrics, the data lineage (table, version or
version range, rows trained per epoch, the datasets of each split) and the registry decision
with its reason. It is one self-contained HTML file: inline SVG (:mod:`keras_dl.report_svg`), no
script, nothing fetched, every value from the run HTML-escaped.

:func:`log_report` runs where a training ends (after the registry gate, passed or refused) and
never fails it: an error is logged as a warning and tagged ``keras_dl.report_failed``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections import defaultdict
from datetime import datetime, timezone
from html import escape
from pathlib import Path

from keras_dl import tracking
from keras_dl.report_svg import line_chart

log = logging.getLogger(__name__)

ARTIFACT = "report.html"
FAILED_TAG = "keras_dl.report_failed"  # why the last attempt to build the report failed
SPEED = ("samples_per_sec", "steps_per_sec")  # Throughput's, per epoch (steps/s: no batch size)
WAIT = ("input_wait_fraction", "input_wait_ms")
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
        return write_report(run_id, tracking_uri)
    except Exception as exc:  # a report is a view of the run: never fail the run for it
        log.warning("Could not build the run report of %s (%s).", run_id, exc)
        try:
            _client(tracking_uri).set_tag(run_id, FAILED_TAG, tracking.failure_text(exc))
        except Exception:
            pass
        return None


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
        and not k.startswith(("system/", "step_", "test_", *SKIP_PREFIXES))
        and not k.startswith(tuple(f"val_{p}" for p in SKIP_PREFIXES))
    }
    sections = [
        _header(run),
        _section("Learning curves", _learning_charts(learning), "curves"),
        _section("Throughput", _throughput_charts(history), "throughput"),
        _section("System metrics per rank", _system_charts(history), "system"),
        _section("Data lineage", _lineage(run), "lineage"),
        _section("Registry decision", _registry(client, run), "registry"),
        _section("Final metrics", _table(sorted(_final_metrics(run).items())), "final"),
        f"<details><summary>Parameters ({len(run.data.params)})</summary>"
        f"{_table(sorted(run.data.params.items()))}</details>",
    ]
    title = escape(f"{run.info.run_name or run_id} - keras_dl run report")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


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
        ("status when written", info.status),
        ("started", f"{started:%Y-%m-%d %H:%M:%S} UTC" if started else ""),
        ("commit", tags.get("mlflow.source.git.commit", tags.get("git.commit", ""))),
    ]
    failure = tags.get(tracking.FAILURE_TAG)
    if failure:
        rows.append(("failure", f"{failure}: {tags.get(tracking.FAILURE_REASON_TAG, '')}"))
    return f"<h1>Run report</h1>{_table([r for r in rows if r[1]])}"


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
        series = {
            r: [((t - t0) / 1000, v) for _, v, t in ranks[r]]
            for r in sorted(
                ranks, key=lambda r: int(r.rsplit("_", 1)[-1]) if r[-1:].isdigit() else 0
            )
        }
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
    out = _table(rows)
    if datasets:
        out += _table(datasets, head=("dataset", "split", "rows", "digest"))
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
    return f'<p class="verdict {verdict}">{escape(verdict)}</p>' + _table([r for r in rows if r[1]])


# -- helpers ----------------------------------------------------------------------------------
def _client(tracking_uri: str | None):
    import os

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


def _epochs(points) -> list[tuple[float, float]]:
    return [(step + 1, value) for step, value, _ in points]  # epochs counted from 1


def _final_metrics(run) -> dict[str, str]:
    """The test split's scores and the one-value metrics (``early_stopping.best``)."""
    return {k: f"{v:.6g}" for k, v in run.data.metrics.items() if k.startswith("test_") or "." in k}


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


def _section(title: str, body: str, anchor: str) -> str:
    body = body or '<p class="none">nothing logged</p>'
    return (
        f'<section id="{anchor}"><h2>{escape(title)}</h2><div class="charts">{body}</div></section>'
    )


def _table(rows, head=None) -> str:
    if not rows:
        return ""
    cells = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    top = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" if head else ""
    return f"<table>{top}{cells}</table>"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1320px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
table{border-collapse:collapse;margin:4px 12px 4px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top;font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
svg.chart{border:1px solid #eee;background:#fff}.frame{fill:none;stroke:#bbb}
.title{font-weight:600;font-size:13px}.tick,.legend,.axis{font-size:11px;fill:#444}
.verdict{font-weight:700;padding:4px 10px;border-radius:4px;display:inline-block}
.passed{background:#d9f2e3}.refused{background:#fde2e1}.none{color:#777}
"""
