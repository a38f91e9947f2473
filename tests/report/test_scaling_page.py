"""The scaling study's page (keras_dl.report.scaling), built from a real MLflow parent run and
its children, rendered by a real headless Chromium: both bar charts drawn, one bar per setup, the
efficiency table computed against setup 1, and the page logged to the parent run."""

from __future__ import annotations

import re

from tests.report.test_report import chromium, coloured_pixels


def _study(uri: str, setups):
    """A parent run and a child per setup: ``(label, replicas, seconds, val_losses, samples/s)``."""
    import mlflow

    from keras_dl.report import scaling

    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("scaling-page")
    parent = client.create_run(exp, tags={scaling.SETUPS_TAG: ",".join(s[0] for s in setups)})
    parent_id = parent.info.run_id
    client.log_param(parent_id, "callbacks.patience", "3")
    for order, (label, replicas, seconds, losses, speeds) in enumerate(setups):
        tags = {
            "mlflow.parentRunId": parent_id,
            scaling.SETUP_TAG: label,
            scaling.ORDER_TAG: str(order),
            scaling.REPLICAS_TAG: str(replicas),
        }
        run_id = client.create_run(exp, tags=tags).info.run_id
        for epoch, speed in enumerate(speeds):
            client.log_metric(run_id, "loss", 1.0 / (epoch + 1), step=epoch)
            client.log_metric(run_id, "samples_per_sec", speed, step=epoch)
        for epoch, loss in enumerate(losses):
            client.log_metric(run_id, "val_loss", loss, step=epoch)
        client.log_metric(run_id, scaling.SECONDS, seconds)
        client.log_param(run_id, "early_stopping.reason", "patience")
        client.set_terminated(run_id)
    return client, parent_id


def test_the_page_draws_time_to_stop_and_validation_loss_per_setup(mlflow_uri, tmp_path):
    from keras_dl.report.page import COLOURS
    from keras_dl.report.scaling import write_page

    client, parent = _study(
        mlflow_uri,
        [
            # label, replicas, seconds, val_loss per epoch, samples/s per epoch (first: tracing)
            ("1", 1, 40.0, [0.9, 0.5, 0.4], [500.0, 1000.0, 1000.0]),
            ("mirrored:2", 2, 30.0, [0.9, 0.6, 0.45], [700.0, 1500.0, 1500.0]),
            ("np:-2", 2, 25.0, [1.0, 0.8, 0.7], [100.0, 1800.0, 1800.0]),
        ],
    )
    page = write_page(client, parent, str(tmp_path / "study.html"))
    assert [f.path for f in client.list_artifacts(parent)] == ["scaling.html"]
    dom, shot = chromium(page, tmp_path)
    bars = re.findall(r'<rect class="bar" data-bar="([^"]+)" data-value="([^"]+)"', dom)
    assert bars == [
        ("1", "40"),
        ("mirrored:2", "30"),
        ("np:-2", "25"),  # time to stop
        ("1", "0.4"),
        ("mirrored:2", "0.45"),
        ("np:-2", "0.7"),  # the last epoch's val_loss
    ]
    assert 'aria-label="time to stop (s)"' in dom and 'aria-label="final validation loss"' in dom
    # samples/s per replica (the median after the first epoch) and over setup 1's: 1.00, 0.75, 0.90
    rows = re.findall(r"<tr><td>([^<]+)</td><td>(\d)</td><td>FINISHED</td><td>3</td>", dom)
    assert rows == [("1", "1"), ("mirrored:2", "2"), ("np:-2", "2")]
    assert "<td>750</td><td>0.75</td>" in dom and "<td>900</td><td>0.90</td>" in dom
    assert "<td>1000</td><td>1.00</td>" in dom
    # Each setup's colour is on the screen twice (its two bars), not only in the markup.
    for colour in COLOURS[:3]:
        assert coloured_pixels(shot, colour) > 2 * 1500, colour


def test_a_setup_without_a_validation_loss_shows_no_bar(mlflow_uri, tmp_path):
    from keras_dl.report.scaling import render

    client, parent = _study(
        mlflow_uri, [("1", 1, 10.0, [], [900.0]), ("np:-2", 2, 12.0, [0.5], [1000.0])]
    )
    html = render(client, parent)
    assert re.findall(r'data-bar="([^"]+)" data-value="[^"]+"', html) == ["1", "np:-2", "np:-2"]
    assert ">n/a</text>" in html
    assert "<td>500</td><td>0.56</td>" in html  # 1000/2 per replica, over 900
