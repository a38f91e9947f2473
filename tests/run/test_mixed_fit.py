"""fit() on digits mixed from two sources (data.sources) in process: each epoch logs its rows
per source, each source is a dataset input with its weight and has its own test metrics, and
the registered version's lineage names every source and version, with a training manifest per
source that `keras-dl lineage` answers from."""

from __future__ import annotations

import deltalake
import mlflow
import pytest

from keras_dl.lineage.query import TRAINED, find_versions
from tests.conftest import train_digits

SOURCES = (
    "data.sources=[{name: low, table: TABLE, weight: 0.7, filters: [label < 5]},"
    " {name: high, table: TABLE, weight: 0.3, filters: [label >= 5]}]"
)


@pytest.mark.slow  # 35 s on 2 cores
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
    # The training manifest holds each source as its own split (not one source standing for
    # the mix), and `keras-dl lineage` counts a row in the source that trained on it.
    assert run.data.tags["keras_dl.manifest"].startswith(f"runs:/{run.info.run_id}/")
    assert version.tags["keras_dl.manifest"] == run.data.tags["keras_dl.manifest"]
    for name in ("low", "high"):
        fp = run.data.tags[f"keras_dl.fingerprint.train/{name}"]
        assert next(d for n, d in inputs.items() if n.endswith(f":train/{name}")).digest == fp[:36]
    rows = deltalake.DeltaTable(digits_table).to_pyarrow_table().to_pandas()
    count = rows.groupby(["split", "label"]).size()
    (answer,) = find_versions(digits_table, ["label = 7"], tracking_uri=uri)
    assert answer.status == TRAINED and answer.version == result.registered_version
    assert answer.table_version == 0
    # data.table's own validation and test splits evaluate the mix, counted beside it.
    assert answer.splits == {
        "train/low": 0,
        "train/high": count["train", 7],
        "validation": count["validation", 7],
        "test": count["test", 7],
    }
    (answer,) = find_versions(digits_table, ["label = 2"], tracking_uri=uri)
    assert (answer.splits["train/low"], answer.splits["train/high"]) == (count["train", 2], 0)
