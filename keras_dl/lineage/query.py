"""Which registered model versions trained on the rows a predicate (or row ids) names.

Every version of every registered model in the store is looked at once: its training manifest
(the ``keras_dl.manifest`` tag registration copies from its run) says which rows of which table
each split read, and :mod:`.matches` counts those that match. A warm-started version
(``keras_dl.init_from``: ``models:/NAME/VERSION``) carries what its ancestors trained on, so the
chain is followed to its root: a version is reported when it or any ancestor trained on a
matching row. A train split mixed from ``data.sources`` answers per source (``train/NAME``),
counting every row the source's share was drawn from. A version without a manifest (trained on
a Spark DataFrame, on TFDS without a table, or before manifests were kept) is reported as having
no row lineage, never as "none".
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from keras_dl.lineage.manifest import SplitManifest, fingerprint, from_header
from keras_dl.lineage.matches import Count, TableReader, count_row_ids, count_where
from keras_dl.lineage.record import MANIFEST_TAG
from keras_dl.model.warm_start import INIT_FROM_TAG

TRAINED, UNKNOWN, NO_LINEAGE = "trained", "cannot tell", "no row lineage"


@dataclass
class VersionAnswer:
    """One registered version's answer.

    Attributes:
        model, version, aliases, run_id: The version.
        status: "trained" (it or an ancestor trained on a matching row), "cannot tell" (some
            split's count cannot be told: ``reasons``), or "no row lineage" (no manifest).
        splits: Per split of its own training, the matching rows (0 included).
        reasons: Why a count cannot be told, per split (or for the version).
        via: The warm-start ancestors that trained on a matching row (or cannot tell), nearest
            first: ``{"model", "version", "status", "splits"}``.
        init_from: The version it was warm-started from, ``models:/NAME/VERSION``, or None.
        fingerprint: Its train split's fingerprint, or None (also for a mixed split).
        table_version: The table version its train split read (a range's end; the earliest
            of a mixed split's sources on the table), or None.
    """

    model: str
    version: int
    aliases: list[str]
    run_id: str
    status: str = ""
    splits: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    via: list[dict] = field(default_factory=list)
    init_from: str | None = None
    fingerprint: str | None = None
    table_version: int | None = None

    @property
    def direct(self) -> bool:
        return any(self.splits.values())

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "version": self.version,
            "aliases": self.aliases,
            "run_id": self.run_id,
            "status": self.status,
            "rows": self.splits,
            "reasons": self.reasons,
            "via": self.via,
            "init_from": self.init_from,
            "fingerprint": self.fingerprint,
            "table_version": self.table_version,
        }


def find_versions(
    table: str,
    where: Sequence[str] = (),
    row_ids: Sequence[int] = (),
    tracking_uri: str | None = None,
    models: Sequence[str] = (),
) -> list[VersionAnswer]:
    """Every registered version whose training (or an ancestor's) included a matching row of
    ``table``, those that cannot tell, and those without row lineage; by model and version.

    Args:
        table: The table's path or URI, as the runs read it.
        where: ``"COLUMN OP VALUE"`` predicates (ANDed), the language of ``data.filters``.
        row_ids: Delta row ids (row tracking), instead of ``where``.
        tracking_uri: The MLflow store with the registry. Defaults to MLflow's.
        models: Only these registered models. Defaults to all of them.
    """
    from keras_dl import tracking

    client = tracking.client(tracking_uri)
    wanted = same_table(table)
    reader = TableReader()
    ids = np.asarray(sorted(set(int(i) for i in row_ids)), dtype=np.int64)
    answers: dict[tuple[str, int], VersionAnswer] = {}
    with tempfile.TemporaryDirectory(prefix="keras_dl_lineage-") as tmp:
        _answer_all(client, models, wanted, where, ids, reader, answers, tmp)
    for answer in answers.values():
        answer.via = _ancestors(answer, answers)
        if not answer.status:
            if answer.direct or any(a["status"] == TRAINED for a in answer.via):
                answer.status = TRAINED
            elif answer.reasons or answer.via:
                answer.status = UNKNOWN
    return [a for _, a in sorted(answers.items()) if a.status]


def _answer_all(client, models, wanted, where, ids, reader, answers, tmp) -> None:
    """Each version's own answer (its splits' counts), into ``answers``."""
    versions = []
    for rm in _registered_models(client, models):
        aliases: dict[int, list[str]] = {}
        for alias, v in (rm.aliases or {}).items():
            aliases.setdefault(int(v), []).append(alias)
        versions += [
            (rm.name, mv, sorted(aliases.get(int(mv.version), [])))
            for mv in _versions(client, rm.name)
        ]
    stores = _artifact_uris(client, {mv.run_id for _, mv, _ in versions if mv.run_id})
    for name, mv, aliases in versions:
        tags = mv.tags or {}
        answer = VersionAnswer(
            name, int(mv.version), aliases, mv.run_id, init_from=tags.get(INIT_FROM_TAG)
        )
        answers[(name, answer.version)] = answer
        location = tags.get(MANIFEST_TAG)
        if location is None:
            answer.status = NO_LINEAGE
            answer.reasons["*"] = (
                "no training manifest: trained on a Spark DataFrame, on TFDS without a "
                "table, or before keras_dl kept manifests; its rows cannot be named"
            )
            continue
        for m, values in _manifests(stores, client, location, tmp):
            if same_table(m.table) != wanted:
                continue
            count = count_row_ids(m, ids) if len(ids) else count_where(m, where, values, reader)
            _add(answer, m, count)
            if m.split == "train":
                answer.fingerprint = fingerprint(m)
            trains = m.split == "train" or m.split.startswith("train/")  # or a mixed source
            if trains and m.version is not None:
                seen = answer.table_version
                answer.table_version = m.version if seen is None else min(seen, m.version)


def _artifact_uris(client, run_ids: set[str]) -> dict[str, str]:
    """Each run's artifact root, in one search per 100 runs (not a get_run each)."""
    experiments = [e.experiment_id for e in client.search_experiments(view_type=3)]
    out, ids = {}, sorted(run_ids)
    for i in range(0, len(ids), 100):
        chunk = ", ".join(f"'{r}'" for r in ids[i : i + 100])
        for run in client.search_runs(
            experiments, f"attributes.run_id IN ({chunk})", run_view_type=3, max_results=100
        ):
            out[run.info.run_id] = run.info.artifact_uri
    return out


def same_table(uri: str) -> str:
    """A table's location as compared: local paths absolute, no trailing slash."""
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if "://" not in uri:
        return os.path.abspath(uri).rstrip("/")
    return uri.rstrip("/")


def _add(answer: VersionAnswer, m: SplitManifest, count: Count) -> None:
    if count.rows is None:
        answer.reasons[m.split] = count.reason
    else:
        answer.splits[m.split] = answer.splits.get(m.split, 0) + count.rows


def _ancestors(answer: VersionAnswer, answers: dict) -> list[dict]:
    out, seen, ref = [], {(answer.model, answer.version)}, answer.init_from
    while ref:
        key = _parse_ref(ref)
        if key is None or key in seen or key not in answers:
            break
        seen.add(key)
        parent = answers[key]
        if parent.direct or parent.reasons:
            status = (
                TRAINED if parent.direct else (NO_LINEAGE if "*" in parent.reasons else UNKNOWN)
            )
            out.append(
                {"model": key[0], "version": key[1], "status": status, "rows": parent.splits}
            )
        ref = parent.init_from
    return out


def _parse_ref(ref: str) -> tuple[str, int] | None:
    body = ref[len("models:/") :] if ref.startswith("models:/") else ref
    name, _, version = body.rpartition("/")
    return (name, int(version)) if name and version.isdigit() else None


def _registered_models(client, names: Sequence[str]):
    if names:
        return [client.get_registered_model(n) for n in names]
    out, token = [], None
    while True:
        page = client.search_registered_models(max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _versions(client, name: str):
    out, token = [], None
    while True:
        page = client.search_model_versions(f"name = '{name}'", max_results=10000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _manifests(stores: dict[str, str], client, location: str, into: str):
    """Each split manifest at ``location`` (``runs:/RUN/keras_dl_lineage/manifest.json``),
    downloaded under ``into``, with a loader of its lineage-column values."""
    from keras_dl.tracking import artifact_repository

    run_id, _, path = location[len("runs:/") :].partition("/")
    target = os.path.join(into, run_id)
    os.makedirs(target, exist_ok=True)
    # The run's own store, straight: runs:/ URIs also look for logged models (2x the time).
    root = stores.get(run_id) or client.get_run(run_id).info.artifact_uri
    repo = artifact_repository(root)
    folder = repo.download_artifacts(path.rsplit("/", 1)[0], target)
    with open(os.path.join(folder, "manifest.json")) as f:
        headers = json.load(f)["splits"]
    for header in headers.values():
        files = pq.read_table(os.path.join(folder, header["files"]))
        values = header.get("values")
        path = os.path.join(folder, values) if values else None
        yield from_header(header, files), (lambda p=path: pq.read_table(p) if p else None)
