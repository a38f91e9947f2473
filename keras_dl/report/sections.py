"""The run report's sections, each drawn from the finished run as MLflow holds it: the header,
the learning, throughput and system charts, the data lineage, the registry decision and the
final metrics (:mod:`keras_dl.report.build` puts them on one page)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone
from html import escape

from keras_dl import tracking
from keras_dl.report.page import line_chart, table

MAX_POINTS = 500
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


def header(run) -> str:
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


def learning_charts(learning: dict) -> str:
    names = sorted({k.removeprefix("val_") for k in learning})
    charts = []
    for name in names:
        series = {k: _epochs(learning[k]) for k in (name, f"val_{name}") if k in learning}
        charts.append(line_chart(name, series, dashed=[f"val_{name}"]))
    return "".join(charts)


def throughput_charts(history: dict) -> str:
    charts = []
    for title, keys in (("samples per second", SPEED), ("input wait", WAIT)):
        key = next((k for k in keys if k in history), None)
        if key is not None:
            values = _epochs(history[key])
            if key == "input_wait_fraction":  # a share of step time: shown as percent
                key, values = "input wait (% of step time)", [(x, 100 * y) for x, y in values]
            charts.append(line_chart(title, {key: values}))
    return "".join(charts)


def system_charts(history: dict) -> str:
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


def lineage(run) -> str:
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


def registry(client, run) -> str:
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


def final_metrics(run) -> dict[str, str]:
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
