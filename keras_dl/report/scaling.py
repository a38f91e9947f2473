"""The scaling study's page (``keras-dl scaling``): one recipe on several cluster setups.

Built from the parent MLflow run and its children alone, as the run report is: two bar charts,
the time each setup took to stop and its final validation loss (a setup that is faster but
stops at a worse loss is no win), and a table of throughput per replica and scaling
efficiency: samples/s per replica over the single-device setup's. One self-contained HTML file
(inline SVG from :mod:`keras_dl.report.page`), every value from the runs HTML-escaped.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from keras_dl.report.build import metric_history
from keras_dl.report.page import bar_chart, page, section, table

ARTIFACT = "scaling.html"
SETUPS_TAG = "keras_dl.scaling.setups"  # the parent's: the setups as --setups wrote them
SETUP_TAG = "keras_dl.scaling.setup"  # each child's: its setup, "np:-2"
ORDER_TAG = "keras_dl.scaling.order"  # each child's place in --setups
REPLICAS_TAG = "keras_dl.scaling.replicas"
HOST_TAG = "keras_dl.scaling.host"
SECONDS = "scaling.seconds_to_stop"  # the driver's wall clock: start of the setup to its end
THRESHOLDS = (
    "train.epochs",
    "train.batch_size",
    "callbacks.monitor",
    "callbacks.patience",
    "callbacks.min_delta",
    "callbacks.stopping_threshold",
    "callbacks.divergence_threshold",
)


@dataclass(frozen=True)
class SetupFigures:
    """One setup's outcome, read from its child run."""

    label: str
    replicas: int
    run_id: str
    status: str
    epochs: int
    stop_reason: str
    seconds: float | None
    val_loss: float | None
    samples_per_sec: float | None

    @property
    def per_replica(self) -> float | None:
        return None if self.samples_per_sec is None else self.samples_per_sec / self.replicas


def setup_figures(client, parent_run_id: str) -> list[SetupFigures]:
    """The children of ``parent_run_id``, in ``--setups`` order, with their figures."""
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
    )
    children = sorted(children, key=lambda r: int(r.data.tags.get(ORDER_TAG, 0)))
    return [_figures(client, run) for run in children if SETUP_TAG in run.data.tags]


def efficiency(setup: SetupFigures, baseline: SetupFigures | None) -> float | None:
    """Samples/s per replica over the single-device setup's (1.0: perfect linear scaling)."""
    if baseline is None or setup.per_replica is None or not baseline.per_replica:
        return None
    return setup.per_replica / baseline.per_replica


def baseline_of(figures: list[SetupFigures]) -> SetupFigures | None:
    return next((f for f in figures if f.label == "1"), None)


def render(client, parent_run_id: str) -> str:
    """The study's page (see the module's docstring)."""
    parent = client.get_run(parent_run_id)
    tags, params = parent.data.tags, parent.data.params
    figures = setup_figures(client, parent_run_id)
    base = baseline_of(figures)
    head = [
        ("study run", f"{parent.info.run_name} ({parent_run_id})"),
        ("recipe", tags.get("keras_dl.recipe", "")),
        ("setups", tags.get(SETUPS_TAG, "")),
        ("host", tags.get(HOST_TAG, "")),
        ("table", params.get("data.table", "")),
        *((k, params[k]) for k in THRESHOLDS if k in params),
    ]
    charts = bar_chart(
        "time to stop (s)", [(f.label, f.seconds) for f in figures], "setup"
    ) + bar_chart("final validation loss", [(f.label, f.val_loss) for f in figures], "setup")
    rows = [
        (
            f.label,
            f.replicas,
            f.status,
            f.epochs,
            f.stop_reason,
            _num(f.seconds, ".1f"),
            _num(f.val_loss, ".4f"),
            _num(f.samples_per_sec, ".0f"),
            _num(f.per_replica, ".0f"),
            _num(efficiency(f, base), ".2f"),
            f.run_id,
        )
        for f in figures
    ]
    head_row = (
        "setup",
        "replicas",
        "status",
        "epochs",
        "stopped",
        "seconds to stop",
        "final val_loss",
        "samples/s",
        "samples/s per replica",
        "scaling efficiency",
        "run",
    )
    note = (
        "<p>Every setup trains the same recipe with the same global batch, epochs and "
        "early-stopping thresholds. Seconds to stop run from starting the setup (its processes "
        "and TensorFlow included) to its end. Samples/s is the median over the epochs after "
        "the first (which includes tracing). Scaling efficiency is samples/s per replica over "
        "the single-device setup's (setup 1): 1.0 is linear scaling. A setup that stops sooner "
        "at a worse validation loss is not faster.</p>"
    )
    parts = [
        f"<h1>Scaling study</h1>{table([r for r in head if r[1] != ''])}",
        section("Time to stop and validation loss per setup", charts, "charts"),
        section(
            "Throughput per replica",
            f'{note}<div class="figures">{table(rows, head=head_row)}</div>',
            "throughput",
        ),
    ]
    return page(f"{parent.info.run_name or parent_run_id} - keras_dl scaling study", parts)


def write_page(client, parent_run_id: str, out: str | None = None) -> Path:
    """Render the page, log it as the parent run's ``scaling.html``, and return the local
    file (``out``, or one in a temporary folder)."""
    html = render(client, parent_run_id)
    path = Path(out) if out else Path(tempfile.mkdtemp(prefix="keras_dl_scaling_")) / ARTIFACT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:  # the artifact keeps its name
        (Path(tmp) / ARTIFACT).write_text(html, encoding="utf-8")
        client.log_artifact(parent_run_id, str(Path(tmp) / ARTIFACT))
    return path


def _figures(client, run) -> SetupFigures:
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    run_id = run.info.run_id
    losses = _values(client, run_id, "val_loss")
    speeds = _values(client, run_id, "samples_per_sec")
    later = sorted(speeds[1:] or speeds)  # the first epoch includes tracing the graph
    reason = params.get("early_stopping.reason", "")
    return SetupFigures(
        label=tags[SETUP_TAG],
        replicas=int(tags.get(REPLICAS_TAG, 1)),
        run_id=run_id,
        status=run.info.status,
        epochs=len(_values(client, run_id, "loss")),
        stop_reason="ran all epochs" if reason == "completed" else reason,
        seconds=metrics.get(SECONDS),
        val_loss=losses[-1] if losses else None,
        samples_per_sec=later[len(later) // 2] if later else None,
    )


def _values(client, run_id: str, key: str) -> list[float]:
    return [value for _, value, _ in metric_history(client, run_id, key)]


def _num(value: float | None, spec: str) -> str:
    return "" if value is None or not math.isfinite(value) else format(value, spec)
