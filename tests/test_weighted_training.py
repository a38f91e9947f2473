"""Weights change what trains: the digits recipe with class 3 weighing 0, through
``data.weight_column`` and through ``train.class_weight``, end to end (Delta -> fit -> MLflow)."""

import numpy as np
import pyarrow.compute as pc
import pytest

from keras_dl.data import read_table
from keras_dl.data.ingest.datasets import write_table
from tests.conftest import train_digits


@pytest.fixture(scope="module")
def weighted_digits(digits_table, tmp_path_factory) -> str:
    """The digits table with a ``w`` column: 0 for every row of class 3, 1 for the others."""
    table = read_table(digits_table)
    w = pc.if_else(pc.equal(table["label"], 3), 0.0, 1.0)
    path = str(tmp_path_factory.mktemp("tables") / "digits_weighted")
    write_table(table.append_column("w", w), path, partition_by=["split"], rows_per_group=128)
    return path


def recall_per_class(model, table: str) -> dict[int, float]:
    test = read_table(table, filters=["split = test"], columns=["pixels", "label"])
    pixels = np.stack(test["pixels"].to_numpy(zero_copy_only=False)).astype(np.float32)
    labels = test["label"].to_numpy()
    predicted = model.predict(pixels, verbose=0).argmax(-1)
    return {c: float((predicted[labels == c] == c).mean()) for c in np.unique(labels)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "sets", [("data.weight_column=w",), ("train.class_weight=3:0",)], ids=["column", "class"]
)
def test_weight_zero_on_one_class_makes_its_recall_collapse(weighted_digits, tmp_path, sets):
    _, result, _ = train_digits(
        weighted_digits, tmp_path, "train.epochs=4", "tracking.registered_model=none", *sets
    )
    recall = recall_per_class(result.model, weighted_digits)
    assert recall[3] < 0.2, recall  # never weighed, never learned
    others = [r for c, r in recall.items() if c != 3]
    assert np.mean(others) > 0.8, recall
    if sets[0].startswith("data."):
        # The test metrics are weighted too: class 3 (weight 0) is left out of them.
        assert result.metrics["test_accuracy"] > 0.8, result.metrics
