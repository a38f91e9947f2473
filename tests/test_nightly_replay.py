"""The nightly loop when the night's rows cover only some classes: a fine-tune on them alone
forgets the others and the gate refuses it on the whole test split; the same fine-tune with
``data.replay`` keeps them within ``registry.forgetting_tolerance`` and the gate accepts it.

Four classes of points in the plane, around the corners of a square. The night's rows are of
classes 0 and 1 only, and their points have moved (the champion gets many of them wrong), so
a fine-tune learns something on them, and its gate on the changed rows is a real contest."""

from __future__ import annotations

import re
import shutil

import mlflow
import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import write_test_table
from tests.test_nightly_loop import train

pytestmark = pytest.mark.slow

NAME = "loop"  # tests.test_nightly_loop.train registers under this name
GATE = ("registry.must_beat=champion", "registry.set_alias=champion")
CORNERS = np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]]) * 3
MOVED = np.array([[3.0, -0.5], [0.5, 3.0]])  # where classes 0 and 1 are now
CLASSIF = ("data.label=cls", "data.features=x1,x2", "registry.forgetting_tolerance=0.02")


def blobs(per_class: int, centers: np.ndarray, classes, seed: int) -> pa.Table:
    """``per_class`` rows of each class per split around its center (spread 0.5)."""
    rng = np.random.default_rng(seed)
    parts = []
    for split, n in (
        ("train", per_class),
        ("validation", per_class // 4),
        ("test", per_class // 2),
    ):
        for c, center in zip(classes, centers, strict=True):
            xy = center + 0.5 * rng.normal(size=(n, 2))
            parts.append(
                pa.table({"x1": xy[:, 0], "x2": xy[:, 1], "cls": np.full(n, c, np.int64),
                          "split": [split] * n})
            )  # fmt: skip
    return pa.concat_tables(parts)


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """v0: the four classes, a champion trained on it; v1: the night's moved rows of 0 and 1."""
    from deltalake import write_deltalake

    tmp = tmp_path_factory.mktemp("replay")
    table = write_test_table(str(tmp / "table"), blobs(120, CORNERS, range(4), seed=0), 200)
    result = train(table, tmp, "v0", *CLASSIF, "train.epochs=20", *GATE)
    assert result.registered_version == 1
    write_deltalake(table, blobs(120, MOVED, (0, 1), seed=1), mode="append")
    return tmp, table, mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")


def _fine_tune(night, tmp_path, *sets):
    tmp, table, client = night
    copy = tmp_path / "table"
    shutil.copytree(table, copy)  # each fine-tune gates against the same champion (version 1)
    before = int(client.get_model_version_by_alias(NAME, "champion").version)
    assert before == 1
    nightly = ("data.since_version=0", f"model.init_from=models:/{NAME}@champion")
    result = train(
        str(copy), tmp, f"v1-{tmp_path.name}", *CLASSIF, *nightly, "train.epochs=30",
        "train.learning_rate=0.01", *sets, *GATE,
    )  # fmt: skip
    return result, client.get_run(result.run_id)


def test_a_fine_tune_on_the_new_classes_alone_forgets_the_others_and_is_refused(night, tmp_path):
    result, run = _fine_tune(night, tmp_path)
    gate = run.data.tags["keras_dl.gate"]
    metrics = run.data.metrics
    # On the changed rows it beats the champion: that is not what refuses it ...
    assert re.search(
        rf"test_accuracy=\S+ beats {NAME}@champion \(version 1\): \S+ on the same rows", gate
    ), gate
    # ... the whole test split is: the older classes 2 and 3 are forgotten.
    assert f"is worse than {NAME}@champion (version 1)" in gate, gate
    assert "beyond registry.forgetting_tolerance=0.02" in gate, gate
    assert metrics["full_test_accuracy"] < 0.95 * metrics["champion_full_test_accuracy"], metrics
    assert result.registered_version is None
    assert int(night[2].get_model_version_by_alias(NAME, "champion").version) == 1


def test_the_same_fine_tune_with_replay_keeps_the_old_classes_and_is_accepted(night, tmp_path):
    result, run = _fine_tune(night, tmp_path, "data.replay=0.5")
    gate = run.data.tags["keras_dl.gate"]
    metrics = run.data.metrics
    assert re.search(
        rf"test_accuracy=\S+ beats {NAME}@champion \(version 1\): \S+ on the same rows", gate
    ), gate
    assert f"is no worse than {NAME}@champion (version 1)" in gate, gate
    assert metrics["full_test_accuracy"] >= 0.98 * metrics["champion_full_test_accuracy"], metrics
    # Half of each epoch replayed the rows at version 0, half the night's.
    assert run.data.params["data.replay"] == "0.5"
    assert result.registered_version is not None
    after = int(night[2].get_model_version_by_alias(NAME, "champion").version)
    assert after == result.registered_version
