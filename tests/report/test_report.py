"""The run report (keras_dl.report.build): built from a real finished run through MLflow, rendered by a
real headless Chromium (Debian's; `make setup` installs it), the charts checked in the browser's
DOM and in its screenshot, which is kept as the test run's artifact (test-artifacts/report.png,
or $KERAS_DL_TEST_ARTIFACTS; also docs/report.png when KERAS_DL_UPDATE_DOCS=1)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli, train_digits

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(page: Path, out: Path) -> tuple[str, Path]:
    """Render ``page`` in headless Chromium: its DOM after load, and a screenshot of it."""
    assert CHROMIUM, "Chromium is missing: run `make setup` (or apt-get install -y chromium)"
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={out / 'chromium-profile'}",
        "--window-size=1360,2600",
        "--hide-scrollbars",
    ]
    url = page.resolve().as_uri()
    shot = out / "report.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", url], check=True, capture_output=True, timeout=120
    )
    dom = subprocess.run(
        [*flags, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    return dom, shot


class Series(HTMLParser):
    """The charts' series in a DOM: ``(section, chart title, series name, points, d)``."""

    def __init__(self):
        super().__init__()
        self.section, self.chart, self.found, self._title = "", "", [], False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a["id"]
        elif tag == "svg":
            self.chart = a.get("aria-label", "")
        elif tag == "path" and a.get("class") == "series":
            self.found.append(
                (self.section, self.chart, a["data-series"], int(a["data-points"]), a["d"])
            )


def series_in(dom: str) -> list[tuple]:
    parser = Series()
    parser.feed(dom)
    return parser.found


def coloured_pixels(png: Path, colour: str) -> int:
    from PIL import Image

    rgb = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    image = Image.open(png).convert("RGB")
    return sum(n for n, c in image.getcolors(maxcolors=1 << 24) if c == rgb)


@pytest.mark.slow
def test_a_trained_run_gets_a_report_whose_charts_draw_in_chromium(digits_table, tmp_path, capsys):
    # Two epochs; system metrics sampled often enough to draw lines; the gate refuses the model
    # (no test accuracy is above 1), so the report is also written when nothing is registered.
    _, result, uri = train_digits(
        digits_table,
        tmp_path,
        "train.epochs=2",
        "tracking.system_metrics_seconds=0.2",
        "registry.min_metric=test_accuracy>1",
    )
    assert result.not_registered is not None
    import mlflow

    client = mlflow.MlflowClient(uri)
    assert "keras_dl.report_failed" not in client.get_run(result.run_id).data.tags
    page = Path(client.download_artifacts(result.run_id, "report.html", str(tmp_path)))

    dom, shot = chromium(page, tmp_path)
    found = series_in(dom)
    by_section = {}
    for section, chart, name, points, d in found:
        by_section.setdefault(section, set()).add((chart, name))
        assert points >= 1 and re.fullmatch(r"M[\d.]+,[\d.]+( L[\d.]+,[\d.]+)*", d), (chart, d)
        if section in ("curves", "throughput"):
            assert points == 2, (chart, name, points)  # one per epoch
    curves = by_section["curves"]
    assert {("loss", "loss"), ("loss", "val_loss")} <= curves
    assert {("accuracy", "accuracy"), ("accuracy", "val_accuracy")} <= curves
    assert {c for c, _ in by_section["throughput"]} == {"samples per second", "input wait"}
    system = by_section["system"]
    assert ("cpu_percent", "rank_0") in system and ("rss_bytes", "rank_0") in system, system
    # The lineage, the refusal and its reason, as text in the rendered page.
    assert digits_table in dom
    assert "data.rows_trained_per_epoch" in dom
    assert 'class="verdict refused"' in dom and "fails test_accuracy&gt;1" in dom
    assert "<td>status</td><td>FINISHED</td>" in dom  # written once the run has ended
    # The lines were drawn: the screenshot has the series' colours, not only their markup.
    from keras_dl.report.page import COLOURS

    assert coloured_pixels(shot, COLOURS[0]) > 500 and coloured_pixels(shot, COLOURS[1]) > 200
    # Kept as the test run's artifact (test-artifacts/, git-ignored; CI can upload the folder).
    artifacts = Path(os.environ.get("KERAS_DL_TEST_ARTIFACTS", REPO / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    keep = _trimmed(shot, artifacts / "report.png")
    shutil.copy(page, artifacts / "report.html")
    if os.environ.get("KERAS_DL_UPDATE_DOCS") == "1":  # the README's picture
        shutil.copy(keep, REPO / "docs" / "report.png")
    with capsys.disabled():
        print(f"\nreport screenshot: {keep}  page: {page}")


def _trimmed(png: Path, out: Path) -> Path:
    """The screenshot without the empty window below the page."""
    from PIL import Image, ImageOps

    image = Image.open(png).convert("RGB")
    box = ImageOps.invert(image).getbbox()
    image.crop((0, 0, image.width, min(image.height, box[3] + 16))).save(out)
    return out


def test_values_from_the_run_are_escaped_and_never_run(mlflow_uri, tmp_path):
    """A table name, a param and a tag value that are HTML or script come out as text."""
    import mlflow

    from keras_dl.report.build import write_report

    evil = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'
    client = mlflow.MlflowClient(mlflow_uri)
    exp = client.create_experiment("report-escape")
    run = client.create_run(exp, tags={"data.table": evil, "keras_dl.not_registered": evil})
    client.log_param(run.info.run_id, "data.rows_trained_per_epoch", evil)
    for epoch, loss in enumerate((1.0, 0.5)):
        client.log_metric(run.info.run_id, "loss", loss, step=epoch)
    client.set_terminated(run.info.run_id)
    page = write_report(run.info.run_id, mlflow_uri, str(tmp_path / "page.html"))
    html = page.read_text()
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html
    dom, _ = chromium(page, tmp_path)
    assert "<title>pwned" not in dom and "<img" not in dom
    assert [s[2] for s in series_in(dom)] == ["loss"]
    # It was logged to the run as well.
    assert [f.path for f in client.list_artifacts(run.info.run_id)] == ["report.html"]


def test_a_report_that_cannot_be_built_is_tagged_and_does_not_raise(mlflow_uri, tmp_path):
    import mlflow

    from keras_dl.report.build import log_report

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # artifacts cannot go under a file
    client = mlflow.MlflowClient(mlflow_uri)
    exp = client.create_experiment("report-fails", artifact_location=str(blocker / "artifacts"))
    run_id = client.create_run(exp).info.run_id
    assert log_report(run_id, mlflow_uri) is None
    assert client.get_run(run_id).data.tags["keras_dl.report_failed"]


@pytest.mark.slow  # a keras-dl subprocess (TensorFlow imports) and, alone, the digits model
def test_keras_dl_report_rewrites_the_page_of_a_registered_model(digits_model, tmp_path):
    uri, result = digits_model
    out = tmp_path / "again.html"
    proc = run_cli("report", result.run_id, "--tracking-uri", uri, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert 'class="verdict passed"' in html and "registered: digits version 1" in html


def test_a_chart_keeps_finite_points_and_says_when_it_has_none():
    from keras_dl.report.page import line_chart

    svg = line_chart("loss", {"loss": [(1, 0.5)], "val_loss": [(1, float("nan"))]})
    assert [s[2:4] for s in series_in(svg)] == [("loss", 1)]  # one epoch still draws a point
    assert "no data" in line_chart("loss", {"loss": [(1, float("inf"))]})
