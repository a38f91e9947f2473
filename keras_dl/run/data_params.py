"""What a run says about its data: the splits as MLflow Datasets (its inputs), the rows, files
and row groups as params, what depends on the ranks per attempt, and a resume on other ranks.
Only the chief calls these."""

from __future__ import annotations

from keras_dl import tracking
from keras_dl.data.splits import DataSplits
from keras_dl.run.run import Run


def log_inputs(run: Run, data: DataSplits) -> None:
    """The run's inputs: each split's table, version, columns and rows (MLflow's Datasets),
    and its training manifest (:mod:`keras_dl.lineage.record`): the exact rows of each split,
    whose fingerprints are the datasets' digests."""
    from keras_dl.lineage.record import build_manifest, log_manifest
    from keras_dl.tracking.datasets import log_datasets, range_params

    splits = (("train", data.train), ("validation", data.validation), ("test", data.test))
    client = tracking.client(run.exp.tracking.uri)
    # A mixed train split (data.sources) has a manifest per source instead: train/NAME.
    read = [
        (n, None if s is None or (n == "train" and data.sources) else s.snapshot) for n, s in splits
    ]
    manifest = build_manifest(read, run.exp.data, data.sources)
    log_manifest(client, run.run_id, manifest)
    log_datasets(client, run.run_id, splits, data.plan.columns, manifest.fingerprints())
    for key, value in range_params(data.train.snapshot).items():  # data.since_version runs
        client.log_param(run.run_id, key, value)


def log_data_params(run: Run, data: DataSplits, resume, header: dict | None, replicas: int):
    """What the data is, as params; what depends on the number of ranks, per attempt.

    The rows, files and row groups are the table's and never change on a resume. The steps per
    epoch and the padding depend on the ranks: they are params of the first attempt and, for
    every attempt, metrics at the global step it started from (a resume on other ranks would
    otherwise change a param, which MLflow refuses). A resume on other ranks prints one line and
    tags the run with it.
    """
    from keras_dl.run.position import RESUME_TAG, resume_note

    exp, world, stats = run.exp, run.world, data.train.stats
    params = {
        "data.train_rows": stats.rows,
        "data.files": stats.files,
        **({"data.row_groups": stats.row_groups} if stats.row_groups is not None else {}),
        # Every live row trains once per epoch, across all ranks.
        "data.rows_trained_per_epoch": _epoch_rows(data),
        **_skipping_params(data),
    }
    per_ranks = {
        "train.steps_per_epoch": data.train.steps,
        # The padding on this rank (zero weights, for equal steps) fills its last batch.
        "data.padded_rows_per_epoch": data.train.padded_rows,
        "runtime.world_size": world.size,
    }
    logged = tracking.client(exp.tracking.uri).get_run(run.run_id).data.params
    fresh = {k: v for k, v in {**params, **per_ranks}.items() if k not in logged}
    if fresh:
        tracking.log_params(fresh)
    step = int((header or {}).get("global_step", 0))
    tracking.log_metrics({k: float(v) for k, v in per_ranks.items()}, step=step)
    if resume is None or header is None:
        return
    scaled = world.size * replicas
    note = resume_note(resume, header, stats.rows, exp.runtime.lr_scaling, scaled)
    if note:
        print(note)
        tracking.set_tag(RESUME_TAG, note)


def _skipping_params(data) -> dict:
    """Per split read through row filters: the rows whose row groups a filter was applied to
    beside the rows kept, and the files and row groups their statistics skipped unread."""
    out = {}
    for name in ("train", "validation", "test"):
        split = getattr(data, name, None)
        if split is None or split.stats.rows_scanned is None:
            continue  # no row filter: every live row is kept, nothing is scanned for one
        out.update(
            {
                f"data.{name}.rows_scanned": split.stats.rows_scanned,
                f"data.{name}.rows_kept": split.stats.rows,
                f"data.{name}.files_skipped": split.snapshot.skipped_files,
                f"data.{name}.row_groups_skipped": split.stats.row_groups_skipped,
            }
        )
    return out


def _epoch_rows(data: DataSplits) -> int:
    """Rows each epoch trains: the split's, or a mixed split's ``data.epoch_rows``."""
    mix = getattr(data.train.stream, "mix", None)
    return mix.total if mix is not None else data.train.stats.rows
