"""fit() on digits mixed from two sources (data.sources) in process: each epoch logs its rows
per source, each source is a dataset input with its weight and has its own test metrics, and
the registered version's lineage names every source and version."""

from __future__ import annotations

import mlflow

from tests.conftest import train_digits

SOURCES = (
    "data.sources=[{name: low, table: TABLE, weight: 0.7, filters: [label < 5]},"
    " {name: high, table: TABLE, weight: 0.3, filters: [label >= 5]}]"
)


def test_digits_mixed_from_two_sources_logs_rows_per_source_and_lineage(digits_table, tmp_path):
    exp, result, uri = train_digits(
        digits_table,
        tmp_path,
        SOURCES.replace("TABLE", digits_table),
        "data.epoch_rows=1000",
        "train.epochs=3",
        "train.batch_size=32",
    )
    client = mlflow.MlflowClient(uri)
    run = client.get_run(result.run_id)
    for name, share in (("low", 700), ("high", 300)):
        history = client.get_metric_history(run.info.run_id, f"rows_trained/{name}")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == [share] * 3
        assert f"test_{name}_accuracy" in run.data.metrics
    assert [m.value for m in client.get_metric_history(run.info.run_id, "rows_trained")] == [
        1000
    ] * 3
    assert run.data.params["data.rows_trained_per_epoch"] == "1000"
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert {n.rsplit(":", 1)[-1] for n in inputs} >= {"train/low", "train/high", "test"}
    low = next(d for n, d in inputs.items() if n.endswith(":train/low"))
    assert '"weight": 0.7' in low.profile and '"epoch_share": 700' in low.profile
    assert result.registered_version is not None, run.data.tags.get("keras_dl.not_registered")
    version = client.get_model_version(exp.tracking.registered_model, result.registered_version)
    tags = version.tags
    assert tags["data.sources"] == f"low={digits_table}@0,high={digits_table}@0"
    assert tags["data.source.high.weight"] == "0.3"
    # No training manifest of one source standing for the mix: `keras-dl lineage` then says the
    # version has no row lineage instead of counting the wrong rows.
    assert "keras_dl.manifest" not in run.data.tags
    assert run.data.tags["keras_dl.lineage.none"] == "the train split mixes data.sources"
