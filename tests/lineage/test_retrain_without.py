"""keras-dl retrain-without on a Delta table on disk and MLflow on SQLite, with real training:
v1 trains on rows of customer 42 and v2 is warm-started from it on the rows added since (it holds
champion). Once customer 42's rows are deleted, retrain-without tags v1 and v2, trains v2's
config again from scratch (no model.init_from, no data.since_version) on the current version,
and moves champion to that version (v3) after the gate passed it; lineage then names v1 and v2,
not v3. A second call retrains nothing (no affected version holds an alias)."""

from __future__ import annotations

import hashlib
import json

import mlflow
import pyarrow.parquet as pq
import pytest

from keras_dl.lineage.query import find_versions
from tests.conftest import cli_in_process, write_test_table
from tests.lineage.test_erasure_chain import NAME, lineage, rows, train


def retrain_without(uri: str, table: str, where: str):
    out = cli_in_process(
        "retrain-without", table, "--where", where, "--tracking-uri", uri, "--json"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_retrain_without_moves_the_champion_to_a_model_trained_from_scratch(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    table, uri = str(tmp_path / "table"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_test_table(table, rows(240, 60, seed=0, customer_42=(9, 3)), rows_per_group=100)
    train(table, tmp_path, "v1")
    write_deltalake(table, rows(120, 30, seed=1), mode="append")  # table version 1
    train(table, tmp_path, "v2", "data.since_version=0", f"model.init_from=models:/{NAME}@champion")
    where = "customer_id = 42"
    refused = cli_in_process("retrain-without", table, "--where", where, "--tracking-uri", uri)
    assert refused.returncode == 2 and "still has 12 row(s) where" in refused.stderr
    DeltaTable(table).delete(where)  # the erasure: table version 2

    report = retrain_without(uri, table, where)
    fp = hashlib.sha256(where.encode()).hexdigest()
    assert report["predicate_sha256"] == fp and report["table_version"] == 2
    assert report["moved"] == [
        {
            "model": NAME,
            "alias": "champion",
            "from": 2,
            "to": 3,
            "run_id": report["moved"][0]["run_id"],
            "status": "trained",
        }
    ]
    assert report["failed"] == [] and report["cannot_tell"] == []
    assert report["to_delete"] == [
        {"model": NAME, "version": 1, "aliases": []},
        {"model": NAME, "version": 2, "aliases": []},
    ]
    client = mlflow.MlflowClient(uri)
    assert client.get_registered_model(NAME).aliases == {"champion": 3}
    for version in (1, 2):
        tag = json.loads(
            client.get_model_version(NAME, str(version)).tags["keras_dl.trained_on_erased_rows"]
        )
        assert tag == {
            "predicate_sha256": fp,
            "table": table,
            "removed_in_version": 2,
            "removed_in": "first version without them",
        }
    new = client.get_model_version(NAME, "3")
    assert "keras_dl.init_from" not in new.tags  # from scratch
    assert new.tags["keras_dl.replaces"] == f"models:/{NAME}/2"
    assert "keras_dl.trained_on_erased_rows" not in new.tags
    assert 3 not in {a.version for a in find_versions(table, [where], tracking_uri=uri)}
    # Its manifest: the whole table at version 2 (no since_version), none of customer 42's rows.
    folder = client.download_artifacts(new.run_id, "keras_dl_lineage", str(tmp_path))
    with open(f"{folder}/manifest.json") as f:
        header = json.load(f)["splits"]["train"]
    assert (header["version"], header["since_version"], header["rows"]) == (2, None, 231 + 120)
    kept = pq.read_table(f"{folder}/{header['values']}").column("customer_id").to_pylist()
    assert len(kept) == 351 and 42 not in kept

    after = lineage(uri, table, where)
    assert set(after) == {(NAME, 1), (NAME, 2)}  # the old versions, not the new one
    again = retrain_without(uri, table, where)  # idempotent: nothing holds an alias any more
    assert again["moved"] == again["failed"] == [] and len(again["to_delete"]) == 2

    # v3 without row lineage (as a version registered before manifests were kept): it holds
    # champion and its logged config reads the table, so it cannot show it did not train on
    # the rows. Reported and left alone, with the flag named; retrained with the flag.
    from keras_dl.lineage.record import MANIFEST_TAG

    client.delete_model_version_tag(NAME, "3", MANIFEST_TAG)
    left = cli_in_process("retrain-without", table, "--where", where, "--tracking-uri", uri)
    assert left.returncode == 0, left.stdout + left.stderr
    assert f"{NAME} v3 (@champion) hold(s) an alias" in left.stderr
    assert "--retrain-uncertain" in left.stderr
    assert client.get_registered_model(NAME).aliases == {"champion": 3}
    out = cli_in_process(
        "retrain-without",
        table,
        "--where",
        where,
        "--tracking-uri",
        uri,
        "--json",
        "--retrain-uncertain",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert [(m["from"], m["to"], m["status"]) for m in report["moved"]] == [
        (3, 4, "no row lineage")
    ]
    assert client.get_registered_model(NAME).aliases == {"champion": 4}
    v3 = client.get_model_version(NAME, "3").tags
    assert "keras_dl.trained_on_erased_rows" not in v3  # nothing shows it trained on them
    assert client.get_model_version(NAME, "4").tags["keras_dl.replaces"] == f"models:/{NAME}/3"


@pytest.mark.slow
def test_a_retraining_that_fails_or_that_the_gate_refuses_gets_no_version_and_no_alias(
    tmp_path, monkeypatch
):
    from deltalake import DeltaTable

    from tests.lineage.broken_recipe import BREAK

    table, uri = str(tmp_path / "table"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_test_table(table, rows(240, 60, seed=0, customer_42=(9, 3)), rows_per_group=100)
    train(table, tmp_path, "v1", recipe="tests.lineage.broken_recipe")  # tabular's, for now
    DeltaTable(table).delete("customer_id = 42")
    # The recipe's own code fails (a RuntimeError, not keras_dl's): reported as failed with
    # its class and message, exit 4, champion left where it is.
    monkeypatch.setenv(BREAK, "1")
    out = cli_in_process(
        "retrain-without", table, "--where", "customer_id = 42", "--tracking-uri", uri, "--json"
    )
    monkeypatch.delenv(BREAK)
    assert out.returncode == 4, out.stdout + out.stderr
    (failed,) = json.loads(out.stdout)["failed"]
    assert (failed["version"], failed["aliases"], failed["new_version"]) == (1, ["champion"], None)
    assert failed["reason"] == ("training failed: RuntimeError: the recipe's own prepare failed"), (
        failed
    )
    # A floor no model meets: the recipe's gate refuses the retrained one.
    out = cli_in_process(
        "retrain-without",
        table,
        "--where",
        "customer_id = 42",
        "--tracking-uri",
        uri,
        "--set",
        "registry.min_metric=test_loss<0",
    )
    assert out.returncode == 4, out.stdout + out.stderr
    assert "WARNING: lineage@champion STILL POINTS AT v1, A MODEL TRAINED ON ERASED ROWS" in (
        out.stderr
    )
    assert "test_loss<0" in out.stderr
    assert "lineage@champion: NOT moved, still v1 (trained on erased rows)" in out.stdout
    assert (
        "Left for you to delete (keras_dl never deletes model versions): lineage v1 (still "
        "@champion)" in out.stdout
    )
    client = mlflow.MlflowClient(uri)
    assert client.get_registered_model(NAME).aliases == {"champion": 1}
    assert [int(v.version) for v in client.search_model_versions(f"name = '{NAME}'")] == [1]
    tag = json.loads(client.get_model_version(NAME, "1").tags["keras_dl.trained_on_erased_rows"])
    assert (tag["removed_in_version"], tag["removed_in"]) == (1, "first version without them")
    # Run again without the floor: the refused run is resumed (nothing trains) and decided on
    # again by the recipe's own gate, which passes it: champion moves.
    report = retrain_without(uri, table, "customer_id = 42")
    assert [(m["alias"], m["from"], m["to"]) for m in report["moved"]] == [("champion", 1, 2)]
    assert client.get_registered_model(NAME).aliases == {"champion": 2}


@pytest.mark.slow
def test_a_call_that_stopped_after_registering_is_finished_by_the_next_without_training(
    tmp_path,
):
    import yaml
    from deltalake import DeltaTable

    from keras_dl.erasure import retrain

    table, uri = str(tmp_path / "table"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_test_table(table, rows(240, 60, seed=0, customer_42=(9, 3)), rows_per_group=100)
    train(table, tmp_path, "v1")
    where = "customer_id = 42"
    DeltaTable(table).delete(where)  # table version 1
    # What a call killed after its retraining returned leaves: the retraining ran, through
    # the gate, and registered v2; v2 has no tag and champion is still on v1.
    client = mlflow.MlflowClient(uri)
    path = retrain.logged_config(
        client, NAME, 1, client.get_model_version(NAME, "1").run_id, str(tmp_path)
    )
    with open(path) as f:
        config = yaml.safe_load(f)
    done = retrain._train(config["recipe"], path, retrain.retrain_settings(config, NAME, 1, 1, uri))
    assert int(done.registered_version) == 2
    assert client.get_registered_model(NAME).aliases == {"champion": 1}

    report = retrain_without(uri, table, where)

    assert [(m["alias"], m["from"], m["to"], m["run_id"]) for m in report["moved"]] == [
        ("champion", 1, 2, done.run_id)
    ]
    assert report["failed"] == []
    # Taken as it was: not trained again (no v3), tagged as the call would have tagged it.
    assert sorted(int(v.version) for v in client.search_model_versions(f"name = '{NAME}'")) == [
        1,
        2,
    ]
    new = client.get_model_version(NAME, "2")
    assert new.tags["keras_dl.replaces"] == f"models:/{NAME}/1"
    assert json.loads(new.tags["keras_dl.retrained_without"]) == {
        "predicate_sha256": hashlib.sha256(where.encode()).hexdigest(),
        "table_version": 1,
    }
    assert client.get_registered_model(NAME).aliases == {"champion": 2}


def test_a_mixed_run_is_retrained_on_the_erased_tables_current_version_in_each_source():
    """A run mixed from data.sources: each source on the erased table reads its current
    version, all of it (its own pinned version or since_version still holds the erased rows);
    a source on another table and data.table (another table here) are left as they were."""
    from keras_dl.config import resolve
    from keras_dl.erasure import retrain
    from keras_dl.recipe import load_recipe

    erased, other = "/lake/erased", "/lake/other"
    sources = [
        {"name": "old", "table": erased, "weight": 0.5, "version": 3, "since_version": 2},
        {"name": "other", "table": other, "weight": 0.5, "version": 5, "filters": ["x > 1"]},
    ]
    config = {"data": {"table": "/lake/eval", "version": 1, "sources": sources}, "runtime": {}}
    sets = retrain.retrain_settings(config, NAME, 4, 9, None, erased + "/")
    assert not any(s.startswith("data.version=") for s in sets), sets
    exp = resolve(load_recipe("digits").defaults, sets=sets)
    old, kept = exp.data.sources
    assert (old.table, old.version, old.since_version) == (erased, 9, None)
    assert (kept.table, kept.version, kept.filters) == (other, 5, ("x > 1",))
    # A single-table run: data.table is the erased table, read at its current version.
    sets = retrain.retrain_settings({"data": {"table": erased}}, NAME, 4, 9, None, erased)
    assert "data.version=9" in sets and not any("data.sources" in s for s in sets)
