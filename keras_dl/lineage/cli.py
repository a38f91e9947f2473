"""Which registered model versions trained on these rows (an erasure request's first question).

``keras-dl lineage TABLE --where "customer_id = 42"`` (the language of ``data.filters``;
repeat ``--where`` to AND them) or ``--row-ids 7,8,9`` (Delta row ids, with row tracking)
lists every registered version whose training rows included a matching row, directly or
through the versions it was warm-started from (``model.init_from``), with how many rows in
which split; after the rows were deleted too (time travel to the trained version, or
``data.lineage_columns`` after VACUUM). A version it cannot answer for says why.
"""

from __future__ import annotations

import json
import os

from keras_dl.errors import DataError


def add_arguments(p) -> None:
    p.add_argument("table", help="the Delta table (path or URI) the rows are in")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="'COLUMN OP VALUE'",
        help="a predicate as in data.filters, e.g. 'customer_id = 42' (repeat: all must hold)",
    )
    p.add_argument("--row-ids", default="", help="Delta row ids, comma-separated (row tracking)")
    p.add_argument("--model", action="append", default=[], help="only this registered model")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: MLflow's)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")


def read_request(args, command: str = "keras-dl lineage") -> list[int]:
    """The row ids asked for (``[]`` with ``--where``), after checking exactly one of
    ``--where`` and ``--row-ids`` is given and the predicate's columns are the table's.

    Raises:
        DataError: Neither or both given, or a predicate naming no column of the table.
    """
    from keras_dl.data.tables import open_table
    from keras_dl.data.tables.filters import parse_filters

    ids = [int(i) for i in args.row_ids.split(",") if i.strip()] if args.row_ids else []
    if bool(ids) == bool(args.where):
        raise DataError(
            f"{command} needs exactly one of --where 'COLUMN OP VALUE' or --row-ids "
            "ID,ID,...: which rows to look for."
        )
    if args.where:
        try:  # a typo'd column is named now, not as "cannot tell" for every version
            parse_filters(args.where, open_table(args.table).schema)
        except DataError as exc:
            if "is not in the table" in str(exc) or "is not 'COLUMN OP VALUE'" in str(exc):
                raise
    return ids


def run(args) -> int:
    from keras_dl.lineage.query import find_versions

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stdout is the answer
    ids = read_request(args)
    answers = find_versions(args.table, args.where, ids, args.tracking_uri, args.model)
    if args.json:
        print(json.dumps([a.to_dict() for a in answers], indent=1))
        return 0
    asked = " AND ".join(args.where) if args.where else f"row ids {args.row_ids}"
    if not answers:
        print(f"No registered version trained on rows of {args.table} where {asked}.")
        return 0
    print(f"Registered versions that trained on rows of {args.table} where {asked}:")
    rows = [("model", "version", "aliases", "status", "matching rows", "through")]
    for a in answers:
        own = ", ".join(f"{s} {n}" for s, n in sorted(a.splits.items()) if n) or "-"
        via = "; ".join(
            f"v{v['version']} ({', '.join(f'{s} {n}' for s, n in v['rows'].items() if n) or v['status']})"
            for v in a.via
        )
        rows.append(
            (a.model, str(a.version), ",".join(a.aliases) or "-", a.status, own, via or "-")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for a in answers:
        for split, reason in sorted(a.reasons.items()):
            where = "" if split == "*" else f" {split}"
            print(f"{a.model} v{a.version}{where}: {reason}")
    return 0
