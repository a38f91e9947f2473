"""Retrain without erased rows: tag the versions that trained on them, retrain those with aliases.

``keras-dl retrain-without TABLE --where "customer_id = 42"`` (after the rows were deleted from
the table) finds the registered versions that trained on matching rows, directly or through a
warm start (as ``keras-dl lineage`` does), and tags each ``keras_dl.trained_on_erased_rows``. Each
one that holds an alias is trained again from scratch on the table's current version with the
config its run logged, through the recipe's registry gate, and its aliases move to the new
version only when the gate passed it. It reports which aliases moved, which did not (they still
point at a model trained on the erased rows) and which versions are left for you to delete:
keras_dl never deletes a model version. Exit status 4 when a retrained model was refused.

A version that holds an alias and cannot tell whether it trained on the rows (its manifest's
table version is gone, say), or has no row lineage while the config its run logged reads the
table, is reported and left alone; with ``--retrain-uncertain`` it is retrained the same way,
without the tag (nothing shows it trained on the rows).
"""

from __future__ import annotations

import json
import os
import sys

from keras_dl.errors import NotRegistered


def add_arguments(p) -> None:
    from keras_dl.lineage import cli as lineage

    lineage.add_arguments(p)
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a logged setting of every retraining (repeatable), e.g. train.epochs=5",
    )
    p.add_argument(
        "--retrain-uncertain",
        action="store_true",
        help="also retrain the versions holding an alias that cannot tell whether they trained "
        "on the rows, or that have no row lineage and whose logged config reads TABLE",
    )


def run(args) -> int:
    from keras_dl import tracking
    from keras_dl.erasure import mark, retrain
    from keras_dl.errors import ConfigError
    from keras_dl.lineage.cli import read_request
    from keras_dl.lineage.query import NO_LINEAGE, TRAINED, find_versions

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stdout is the answer
    ids = read_request(args, "keras-dl retrain-without")
    current = mark.check_erased(args.table, args.where)
    answers = find_versions(args.table, args.where, ids, args.tracking_uri, args.model)
    client = tracking.client(args.tracking_uri)
    fp = mark.predicate_fingerprint(args.where, ids)
    trained = {(a.model, a.version): a for a in answers if a.status == TRAINED}
    report = {"table": args.table, "table_version": current, "predicate_sha256": fp}
    report.update(tagged=[], moved=[], failed=[], to_delete=[])
    report["cannot_tell"] = [
        {
            "model": a.model,
            "version": a.version,
            "aliases": a.aliases,
            "status": a.status,
            "reasons": a.reasons,
        }
        for a in answers
        if a.status != TRAINED
    ]
    for a in trained.values():
        starts = [a.table_version] + [
            trained[(v["model"], v["version"])].table_version
            for v in a.via
            if (v["model"], v["version"]) in trained
        ]
        starts = [s for s in starts if s is not None]
        version, how = mark.removal_version(
            args.table, args.where, min(starts) if starts else None, current
        )
        value = mark.tag_value(fp, args.table, version, how)
        client.set_model_version_tag(a.model, str(a.version), mark.ERASED_TAG, value)
        report["tagged"].append({"model": a.model, "version": a.version, "value": value})
    new_tags = {
        retrain.RETRAINED_TAG: json.dumps({"predicate_sha256": fp, "table_version": current})
    }
    todo = [a for a in trained.values() if a.aliases]
    for a, entry in zip(
        [a for a in answers if a.status != TRAINED], report["cannot_tell"], strict=True
    ):
        if not (args.retrain_uncertain and a.aliases):
            continue
        if a.status == NO_LINEAGE:
            try:
                reads = retrain.logged_reads(client, a.model, a.version, a.run_id, args.table)
            except ConfigError:
                reads = True  # which table it read cannot be told either: retrain() says why
            if not reads:
                entry["reasons"]["config"] = f"its logged config reads no source on {args.table}"
                continue
        todo.append(a)
    for a in todo:
        tags = {**new_tags, retrain.REPLACES_TAG: f"models:/{a.model}/{a.version}"}
        out = retrain.retrain(
            client,
            a.model,
            a.version,
            a.aliases,
            a.run_id,
            current,
            args.tracking_uri,
            tags,
            args.sets,
            args.table,
        )
        for alias in out.moved:
            report["moved"].append(
                {
                    "model": a.model,
                    "alias": alias,
                    "from": a.version,
                    "to": out.new_version,
                    "run_id": out.run_id,
                    "status": a.status,
                }
            )
        left = [x for x in a.aliases if x not in out.moved]
        if left:
            report["failed"].append(
                {
                    "model": a.model,
                    "version": a.version,
                    "aliases": left,
                    "run_id": out.run_id,
                    "new_version": out.new_version,
                    "status": a.status,
                    "reason": out.reason or "the alias was moved elsewhere meanwhile",
                }
            )
    for a in trained.values():
        held = sorted(
            k
            for k, v in (client.get_registered_model(a.model).aliases or {}).items()
            if str(v) == str(a.version)
        )
        report["to_delete"].append({"model": a.model, "version": a.version, "aliases": held})
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print(report, args)
    return NotRegistered.exit_code if report["failed"] else 0


def _print(report: dict, args) -> None:
    asked = " AND ".join(args.where) if args.where else f"row ids {args.row_ids}"
    table, now = report["table"], report["table_version"]
    if not report["tagged"]:
        print(f"No registered version trained on rows of {table} where {asked}: nothing to do.")
    for t in report["tagged"]:
        removed = json.loads(t["value"])
        print(
            f"{t['model']} v{t['version']}: trained on erased rows (removed in table version "
            f"{removed['removed_in_version']}, {removed['removed_in']}); tagged "
            "keras_dl.trained_on_erased_rows"
        )
    for m in report["moved"]:
        print(
            f"{m['model']}@{m['alias']}: moved from v{m['from']} ({m['status']}) to v{m['to']} "
            f"(trained from scratch on {table} version {now}, run {m['run_id']})"
        )
    for f in report["failed"]:
        what = "TRAINED ON ERASED ROWS"
        if f["status"] != "trained":
            what = f"THAT MAY HAVE TRAINED ON ERASED ROWS ({f['status']})"
        for alias in f["aliases"]:
            print(
                f"WARNING: {f['model']}@{alias} STILL POINTS AT v{f['version']}, A MODEL {what}: "
                f"its retraining (run {f['run_id'] or '-'}) was not registered: "
                f"{f['reason']}. Train a better one (the same keras-dl retrain-without with "
                "--set runtime.resume=false and other train.* settings: without it the same "
                "model is decided on again, for other registry.* settings) or move the alias "
                "by hand (keras-dl promote).",
                file=sys.stderr,
            )
            print(
                f"{f['model']}@{alias}: NOT moved, still v{f['version']} ("
                + ("trained on erased rows" if f["status"] == "trained" else f["status"])
                + ")"
            )
    retrained = {(m["model"], m["from"]) for m in report["moved"]}
    retrained |= {(f["model"], f["version"]) for f in report["failed"]}
    left = []
    for c in report["cannot_tell"]:
        why = "; ".join(c["reasons"].values())
        print(f"{c['model']} v{c['version']}: {c['status']}, not tagged: {why}")
        if (
            c["aliases"]
            and (c["model"], c["version"]) not in retrained
            and "config" not in (c["reasons"])
        ):
            left.append(f"{c['model']} v{c['version']} (@{','.join(c['aliases'])})")
    if left:
        print(
            f"WARNING: {', '.join(left)} hold(s) an alias and cannot show they did not train on "
            "the erased rows: add --retrain-uncertain to retrain them from scratch the same way.",
            file=sys.stderr,
        )
    if report["to_delete"]:
        names = ", ".join(
            f"{d['model']} v{d['version']}"
            + (f" (still @{','.join(d['aliases'])})" if d["aliases"] else "")
            for d in report["to_delete"]
        )
        print(
            f"Left for you to delete (keras_dl never deletes model versions): {names}. "
            "MlflowClient().delete_model_version(NAME, VERSION) once nothing serves them."
        )
