"""Assertions shared by the on-host and on-Spark Horovod tests."""

from __future__ import annotations

import mlflow
import numpy as np

from tests.conftest import runs_in


def check_horovod_run(report: dict, exp, ranks: int = 2) -> None:
    """Identical weights, averaged metrics, one FINISHED run, one registered version."""
    reports = report["ranks"]
    assert [r["rank"] for r in reports] == list(range(ranks))
    assert all(r["size"] == ranks for r in reports)
    # Bit-identical weights on every rank after training.
    assert len({r["digest"] for r in reports}) == 1, [r["digest"] for r in reports]
    # Metrics: every rank's callbacks saw the same numbers, the mean of the ranks' own.
    for epoch in range(exp.train.epochs):
        seen = [r["epochs"][epoch]["logs"] for r in reports]
        local = [r["epochs"][epoch]["local"] for r in reports]
        for key in ("loss", "accuracy"):
            assert len({s[key] for s in seen}) == 1, (epoch, key, seen)
            mean = np.mean([loc[key] for loc in local])
            np.testing.assert_allclose(seen[0][key], mean, rtol=1e-6)
        # The ranks train on different shards, so their own losses differ: averaging is real.
        assert local[0]["loss"] != local[1]["loss"]
    result = report["result"]
    (run,) = runs_in(exp.tracking.uri)
    assert run.info.run_id == result.run_id and run.info.status == "FINISHED"
    assert run.data.params["runtime.np"] == str(exp.runtime.np)
    client = mlflow.MlflowClient(exp.tracking.uri)
    logged = [m.value for m in client.get_metric_history(result.run_id, "loss")]
    expected = [e["logs"]["loss"] for e in reports[0]["epochs"]]
    np.testing.assert_allclose(logged, expected, rtol=1e-6)
    (version,) = client.search_model_versions(f"name='{exp.tracking.registered_model}'")
    assert version.run_id == result.run_id and result.registered_version == int(version.version)
