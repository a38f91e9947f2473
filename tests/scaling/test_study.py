"""keras-dl scaling end to end: the digits recipe on one process and on 2 local Horovod ranks
(1 epoch each), as child runs of one parent run, with the page logged to the parent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import HEAVY, run_cli


@HEAVY
@pytest.mark.slow  # a keras-dl driver, a fresh process for setup 1 and 2 Horovod ranks
def test_keras_dl_scaling_runs_each_setup_as_a_child_run(digits_table, tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = [
        f"data.table={digits_table}",
        f"tracking.uri={uri}",
        f"runtime.run_dir={tmp_path / 'run'}",
        "train.epochs=1",
        "train.verbose=0",
        "callbacks.plots=false",
        "tracking.log_model=false",
    ]
    out = tmp_path / "page.html"
    args = ["scaling", "digits", "--setups", "1,np:-2", "--out", str(out)]
    proc = run_cli(*args, *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent_id = re.search(r"parent run (\w+)", proc.stdout).group(1)
    assert f"page: {out}" in proc.stdout

    client = mlflow.MlflowClient(uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["keras_dl.scaling.setups"] == "1,np:-2"
    assert parent.data.params["callbacks.monitor"] == "val_loss"  # the study's thresholds
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    by_setup = {c.data.tags["keras_dl.scaling.setup"]: c for c in children}
    assert sorted(by_setup) == ["1", "np:-2"]
    single, ranks = by_setup["1"], by_setup["np:-2"]
    for child, replicas, strategy, np in (
        (single, "1", "none", "0"),
        (ranks, "2", "horovod", "-2"),
    ):
        assert child.info.status == "FINISHED"
        assert child.data.tags["keras_dl.scaling.replicas"] == replicas
        assert child.data.params["runtime.strategy"] == strategy
        assert child.data.params["runtime.np"] == np
        assert child.data.params["callbacks.monitor"] == "val_loss"  # the same thresholds
        m = child.data.metrics
        assert m["scaling.seconds_to_stop"] > 0 and m["val_loss"] > 0
        assert m["scaling.samples_per_sec_per_replica"] > 0
    assert single.data.metrics["scaling.scaling_efficiency"] == 1.0
    efficiency = ranks.data.metrics["scaling.scaling_efficiency"]
    assert efficiency == pytest.approx(
        ranks.data.metrics["samples_per_sec"] / 2 / single.data.metrics["samples_per_sec"]
    )
    assert parent.data.metrics["np_local_2.scaling_efficiency"] == pytest.approx(efficiency)
    assert parent.data.metrics["single.val_loss"] == single.data.metrics["val_loss"]
    # The page: logged to the parent, and the copy the command printed.
    assert "scaling.html" in [f.path for f in client.list_artifacts(parent_id)]
    logged = client.download_artifacts(parent_id, "scaling.html", str(tmp_path / "dl"))
    html = out.read_text()
    assert Path(logged).read_text() == html
    bars = re.findall(r'data-bar="([^"]+)"', html)
    assert bars == ["1", "np:-2", "1", "np:-2"]  # time to stop, final validation loss
    assert single.info.run_id in html and ranks.info.run_id in html
