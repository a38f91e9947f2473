"""keras-dl lineage over a registry made through MLflow's client (no training): real manifests
from the snapshot code, registered with the tags registration copies. Warm-start chains, row
ids, versions of other tables, and a version without a manifest."""

from __future__ import annotations

import json
import os

import mlflow
import numpy as np
import pyarrow as pa

from keras_dl.data import open_table
from keras_dl.data.tables.filters import parse_filters, select
from keras_dl.lineage.record import Manifest, log_manifest, split_manifest, version_tags
from tests.conftest import cli_in_process
from tests.fixtures.delta_protocol import write_protocol_table


def customers(path, base_row_ids=False) -> str:
    """Two files of 50 rows, ids 0-99, customer_id = 40 + id % 5 (20 rows each)."""
    files = []
    for f in range(2):
        ids = np.arange(f * 50, f * 50 + 50, dtype=np.int64)
        files.append([pa.table({"id": ids, "customer_id": 40 + ids % 5})])
    write_protocol_table(path, files, [[0, 1], []])  # rows 0 and 1 (customers 40, 41) deleted
    if base_row_ids:  # row tracking's baseRowId on each add (file f's rows are 1000 f + index)
        log = os.path.join(path, "_delta_log", f"{0:020d}.json")
        with open(log) as f:
            actions = [json.loads(line) for line in f]
        adds = iter(range(10))
        for a in actions:
            if "add" in a:
                a["add"]["baseRowId"] = 1000 * next(adds)
        with open(log, "w") as f:
            f.write("\n".join(json.dumps(a) for a in actions) + "\n")
    return str(path)


def register(client, exp, name, table, filters=(), init_from=None, keep=()):
    run = client.create_run(exp).info.run_id
    snap = open_table(table)
    if filters:
        snap = select(snap, parse_filters(list(filters), snap.schema))
    m, values = split_manifest("train", snap, filters, None, keep)
    log_manifest(client, run, Manifest({"train": m}, {"train": values} if keep else {}))
    if init_from:
        client.set_tag(run, "keras_dl.init_from", init_from)
    client.set_terminated(run)
    folder = os.path.join(os.path.dirname(table), f"model-{run}")
    os.makedirs(folder)
    tags = version_tags(client.get_run(run).data.tags)
    return client.create_model_version(name, folder, run, tags=tags)


def lineage(uri, table, *args):
    out = cli_in_process("lineage", table, *args, "--tracking-uri", uri, "--json")
    assert out.returncode == 0, out.stderr
    return {(a["model"], a["version"]): a for a in json.loads(out.stdout)}


def test_lineage_follows_warm_starts_and_names_what_it_cannot_tell(tmp_path):
    table = customers(tmp_path / "t", base_row_ids=True)
    other = customers(tmp_path / "other")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("lineage")
    client.create_registered_model("m")
    register(client, exp, "m", table, keep=("customer_id",))  # v1: every live row
    register(client, exp, "m", table, ["customer_id != 42"], init_from="models:/m/1")  # v2
    register(client, exp, "m", other)  # v3: another table
    register(client, exp, "m", table, ["customer_id != 42"])  # v4: from scratch, without them
    client.set_registered_model_alias("m", "champion", "2")
    client.create_registered_model("frame")
    client.create_model_version("frame", str(tmp_path), None)  # no manifest

    answer = lineage(uri, table, "--where", "customer_id = 42")
    assert set(answer) == {("m", 1), ("m", 2), ("frame", 1)}
    assert answer[("m", 1)]["rows"] == {"train": 20} and answer[("m", 1)]["status"] == "trained"
    second = answer[("m", 2)]
    assert second["rows"] == {"train": 0} and second["aliases"] == ["champion"]
    assert [(v["version"], v["rows"]) for v in second["via"]] == [(1, {"train": 20})]
    assert answer[("frame", 1)]["status"] == "no row lineage"
    # A predicate on a column not kept: by time travel, the same count.
    both = lineage(uri, table, "--where", "customer_id = 42", "--where", "id >= 50")
    assert both[("m", 1)]["rows"] == {"train": 10}

    # Row ids: baseRowId + position. File 0's rows 0 and 1 were deleted before training.
    ids = lineage(uri, table, "--row-ids", "0,1,2,1003,1049,5000")
    assert ids[("m", 1)]["rows"] == {"train": 3}  # 2, 1003, 1049
    assert ids[("m", 4)]["rows"] == {"train": 2}  # not 2: its customer is 42
    untracked = lineage(uri, other, "--row-ids", "3")
    assert untracked[("m", 3)]["status"] == "cannot tell"
    assert "no row tracking" in untracked[("m", 3)]["reasons"]["train"]


def test_lineage_needs_a_predicate_or_row_ids(tmp_path):
    table = customers(tmp_path / "t")
    out = cli_in_process("lineage", table, "--tracking-uri", f"sqlite:///{tmp_path / 'db'}")
    assert out.returncode == 2 and "--where 'COLUMN OP VALUE' or --row-ids" in out.stderr
    out = cli_in_process("lineage", table, "--where", "nope = 1")
    assert out.returncode == 2 and "'nope' is not in the table" in out.stderr
