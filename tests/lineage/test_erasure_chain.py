"""The Done-when test of row lineage: a nightly chain on a Delta table on disk and MLflow on
SQLite. v1 trains on the first rows (customer 42's among them, data.lineage_columns keeps
customer_id); v2 is warm-started from v1 (models:/lineage@champion) on the rows added since;
the customer's rows and others are deleted and v3 retrains from scratch. `keras-dl lineage
--where "customer_id = 42"` names v1 (its own rows) and v2 (through v1) and not v3, with the
right counts, before and after VACUUM removed the files v1 read."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pyarrow as pa
import pytest

from keras_dl.config import resolve
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import cli_in_process, seed_store, write_test_table

NAME = "lineage"


def rows(n_train: int, n_test: int, seed: int, customer_42: tuple[int, int] = (0, 0)):
    """Regression rows ``y = 2 x1 - x2``; ``customer_42`` rows of customer 42 in (train, test)."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    customer = rng.integers(100, 200, size=n)
    customer[: customer_42[0]] = 42
    customer[n_train : n_train + customer_42[1]] = 42
    return pa.table(
        {
            "x1": x1,
            "x2": x2,
            "y": 2 * x1 - x2,
            "split": ["train"] * n_train + ["test"] * n_test,
            "customer_id": customer,
            "batch": [seed] * n,
        }
    )


def train(table: str, tmp, run: str, *sets: str, recipe: str = "tabular"):
    recipe = load_recipe(recipe)
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            "data.label=y",
            "data.features=x1,x2",
            "data.split_column=split",
            "data.validation_split=",
            "data.lineage_columns=customer_id",
            f"tracking.uri={seed_store(tmp / 'mlflow.db')}",
            f"tracking.registered_model={NAME}",
            "registry.set_alias=champion",
            f"runtime.run_dir={tmp / run}",
            "train.verbose=0",
            "train.epochs=1",
            "train.batch_size=64",
            "callbacks.plots=false",
            *sets,
        ],
    )
    result = fit(exp, recipe)
    assert mlflow.active_run() is None and result.registered_version is not None
    return result


def lineage(uri: str, table: str, *where: str) -> list[dict]:
    args = [a for w in where for a in ("--where", w)]
    out = cli_in_process("lineage", table, *args, "--tracking-uri", uri, "--json")
    assert out.returncode == 0, out.stderr
    return {(a["model"], a["version"]): a for a in json.loads(out.stdout)}


@pytest.mark.slow
def test_lineage_names_the_chain_that_trained_on_a_customer_before_and_after_vacuum(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    table, uri = str(tmp_path / "table"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_test_table(table, rows(240, 60, seed=0, customer_42=(9, 3)), rows_per_group=100)
    v1 = train(table, tmp_path, "v1")
    write_deltalake(table, rows(120, 30, seed=1), mode="append")  # table version 1
    v2 = train(
        table, tmp_path, "v2", "data.since_version=0", f"model.init_from=models:/{NAME}@champion"
    )
    dt = DeltaTable(table)
    dt.delete("customer_id = 42")  # the erasure (version 2)
    dt.delete("x1 > 1.5")  # other rows go too (version 3)
    v3 = train(table, tmp_path, "v3")
    assert (v1.registered_version, v2.registered_version, v3.registered_version) == (1, 2, 3)

    client = mlflow.MlflowClient(uri)
    # Each version names its data: the manifest and the fingerprint, also the dataset digest.
    for result in (v1, v2, v3):
        version = client.get_model_version(NAME, str(result.registered_version))
        run = client.get_run(result.run_id)
        fp = version.tags["keras_dl.fingerprint.train"]
        assert len(fp) == 64 and run.data.tags["keras_dl.fingerprint.train"] == fp
        assert version.tags["keras_dl.manifest"].startswith(f"runs:/{result.run_id}/")
        train_input = next(
            i for i in run.inputs.dataset_inputs if i.dataset.name.endswith(":train")
        )
        assert train_input.dataset.digest == fp[:36]
        assert json.loads(train_input.dataset.profile)["fingerprint"] == fp
    assert client.get_model_version(NAME, "2").tags["keras_dl.init_from"] == f"models:/{NAME}/1"

    def check(answer, how_many_v1_train=9):
        assert set(answer) == {(NAME, 1), (NAME, 2)}, answer  # v3 retrained without them
        first, second = answer[(NAME, 1)], answer[(NAME, 2)]
        assert first["status"] == second["status"] == "trained"
        assert first["rows"] == {"train": how_many_v1_train, "test": 3}
        assert second["rows"] == {"train": 0, "test": 0}  # its own rows: none of customer 42
        assert second["via"] == [
            {"model": NAME, "version": 1, "status": "trained", "rows": first["rows"]}
        ]
        assert second["aliases"] == [] and first["aliases"] == []

    check(lineage(uri, table, "customer_id = 42"))
    # A predicate on a column the manifests did not keep: answered by time travel.
    travelled = lineage(uri, table, "customer_id = 42", "batch = 0")
    check(travelled)
    assert (NAME, 3) not in travelled
    assert client.get_registered_model(NAME).aliases == {"champion": 3}

    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    check(lineage(uri, table, "customer_id = 42"))  # from the kept customer_id values
    # Without the column kept, the vacuumed version cannot tell: said so, not "none".
    honest = lineage(uri, table, "customer_id = 42", "batch = 0")
    assert honest[(NAME, 1)]["status"] == "cannot tell"
    assert "no longer readable" in honest[(NAME, 1)]["reasons"]["train"]
    assert honest[(NAME, 2)]["via"][0]["status"] == "cannot tell"

    # A version registered without a manifest (as a Spark DataFrame's model is): no lineage.
    client.create_registered_model("frame")
    client.create_model_version("frame", f"runs:/{v1.run_id}/model", v1.run_id)
    answer = lineage(uri, table, "customer_id = 42")
    assert answer[("frame", 1)]["status"] == "no row lineage"
    text = cli_in_process("lineage", table, "--where", "customer_id = 42", "--tracking-uri", uri)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert any(line.split()[:4] == [NAME, "1", "-", "trained"] for line in lines), text.stdout
    assert any(line.split()[:2] == [NAME, "2"] and "v1 (" in line for line in lines)
    assert not any(line.split()[:2] == [NAME, "3"] for line in lines)
    assert "frame v1: no training manifest" in text.stdout
