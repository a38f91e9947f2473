"""After training: test evaluation, model logging and registration, then COMPLETE.

The checkpoint directory is marked complete only when all of these are done. Until then the
checkpoints stay, and each step's result is recorded in ``checkpoints/FINISHING.json`` as it
succeeds, so rerunning the same command after a failure here trains nothing (the last
checkpoint is marked ``training_done``) and redoes only the steps that are missing.

Only the chief writes; every rank evaluates its own test shard (no collective is involved).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from keras_dl import storage, tracking
from keras_dl.callbacks import remote_checkpoints as remote
from keras_dl.callbacks.checkpoint import FINISHING, Checkpoint, mark_complete
from keras_dl.divergence import check_finite

log = logging.getLogger(__name__)


def finish(exp, model, data, world, run_id: str | None, checkpoint: Checkpoint):
    """Evaluate on the test split, log and register the model, then mark the run complete.

    Args:
        exp: The resolved experiment.
        model: The trained Keras model.
        data: The :class:`~keras_dl.data.splits.DataSplits` trained on.
        world: This process's world (only the chief logs and writes).
        run_id: The MLflow run (active on the chief).
        checkpoint: The run's :class:`Checkpoint`; its final state is saved first.

    Returns:
        ``(metrics, model_uri, registered_version)``; the last two are None off the chief.

    Raises:
        DivergenceError: A test metric is NaN or infinite (nothing is logged or registered).
    """
    import mlflow

    directory = checkpoint.directory
    chief = world.is_chief
    if chief:
        checkpoint.save_final()  # a rerun after a failure below restores this and trains nothing
    done = read_finishing(directory) if chief else {}
    metrics = done.get("test_metrics")
    if metrics is None:
        metrics = {}
        if data.test is not None:
            scores = model.evaluate(
                data.test.dataset, steps=data.test.steps, return_dict=True, verbose=0
            )
            metrics = {f"test_{k}": float(v) for k, v in scores.items()}
            check_finite(metrics=metrics, learning_rate=exp.train.learning_rate)
        skipped = data.bad_images_skipped()  # data.on_bad_image=skip: rows dropped, every read
        if skipped:
            log.warning("Skipped %d undecodable image(s) (counted over every epoch read).", skipped)
            metrics["data.bad_images_skipped"] = float(skipped)
        if chief:
            if metrics:
                mlflow.log_metrics(metrics)
            record_finishing(directory, test_metrics=metrics)
    if not chief:
        return metrics, None, None
    model_uri, version = done.get("model_uri"), done.get("registered_version")
    if exp.tracking.log_model and model_uri is None:
        lineage = {**data.snapshot.lineage, "keras_dl.recipe": exp.recipe, "run_id": run_id}
        scores = {f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()}
        model_uri, version = tracking.log_keras_model(
            model,
            _sample_input(data),
            exp.tracking.registered_model,
            tags={**lineage, **scores},
            description=tracking.describe_version(exp, lineage, metrics),
        )
        record_finishing(directory, model_uri=model_uri, registered_version=version)
    mark_complete(directory, checkpoint.global_step)
    if remote.is_remote(directory):
        storage.remove(storage.join(str(directory), FINISHING))  # served its purpose
    else:
        (Path(directory) / FINISHING).unlink(missing_ok=True)  # served its purpose
    return metrics, model_uri, version


def read_finishing(directory: str | os.PathLike) -> dict:
    """The finishing steps recorded so far in ``directory`` ({} when none)."""
    try:
        if remote.is_remote(directory):
            return json.loads(storage.read_file(storage.join(str(directory), FINISHING)))
        return json.loads((Path(directory) / FINISHING).read_text())
    except (OSError, ValueError):
        return {}


def record_finishing(directory: str | os.PathLike, **values) -> None:
    """Add ``values`` to ``directory/FINISHING.json`` (atomically)."""
    if remote.is_remote(directory):
        data = json.dumps({**read_finishing(directory), **values}).encode()
        storage.write_atomic(storage.join(str(directory), FINISHING), data)
        return
    path = Path(directory) / FINISHING
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{FINISHING}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**read_finishing(directory), **values}))
    os.replace(tmp, path)


def _sample_input(data, rows: int = 5):
    """A few rows of model input, as numpy, for the model signature."""
    split = data.test or data.validation or data.train
    features = next(iter(split.dataset.take(1)))
    if isinstance(features, tuple):
        features = features[0]
    if isinstance(features, dict):
        return {k: v.numpy()[:rows] for k, v in features.items()}
    return features.numpy()[:rows]
