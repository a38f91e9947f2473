"""After training: test evaluation, model logging, the registry gate, registration, COMPLETE.

A run on the changed rows (``data.since_version``) is also evaluated on the whole test split at
the same version (metrics ``full_test_*``, beside ``test_*`` on the changed rows).

The checkpoint directory is marked complete only when all of these are done. Until then the
checkpoints stay, and each step's result is recorded in ``checkpoints/FINISHING.json`` as it
succeeds, so rerunning the same command after a failure here trains nothing (the last
checkpoint is marked ``training_done``) and redoes only the steps that are missing. A model the
gate refused (:mod:`keras_dl.model.gate`) leaves the directory incomplete too: a rerun decides again.

Only the chief writes; every rank evaluates its own test shard, and the ranks or workers meet
once after it (an allreduce), before the chief goes on.
"""

from __future__ import annotations

import logging

from keras_dl import tracking
from keras_dl.callbacks.checkpoint import Checkpoint
from keras_dl.data.stream.packing import unpack
from keras_dl.divergence import check_finite
from keras_dl.lineage.record import version_tags
from keras_dl.model import gate, publish
from keras_dl.model.log import serving_model

log = logging.getLogger(__name__)


def finish(run, model, data, checkpoint: Checkpoint):
    """Evaluate on the test split, log the model, register it if it earned it, mark complete.

    The model is registered only when :func:`keras_dl.model.gate.decide` passes it. When the gate
    refuses it, the run is tagged ``keras_dl.not_registered`` with the reason and the run
    directory is not marked complete: the same command (or one with other ``registry.*``
    settings) trains nothing and decides again on the same logged model.

    Args:
        run: The :class:`~keras_dl.run.Run` (its experiment, its world: only the chief logs
            and writes; its MLflow run, active on the chief; its folder, for FINISHING.json).
        model: The trained Keras model.
        data: The :class:`~keras_dl.data.splits.DataSplits` trained on.
        checkpoint: The run's :class:`Checkpoint`; its final state is saved first.

    Returns:
        ``(metrics, model_uri, registered_version, not_registered)``: the last three are None
        off the chief; ``not_registered`` is the gate's reason when it refused the model.

    Raises:
        DivergenceError: A test metric is NaN or infinite (nothing is logged or registered).
        ConfigError: ``registry.min_metric`` names a metric the run does not have.
    """
    exp, run_id, folder = run.exp, run.run_id, run.folder
    chief = run.world.is_chief
    if chief:
        checkpoint.save_final()  # a rerun after a failure below restores this and trains nothing
    done = folder.finishing() if chief else {}
    metrics = done.get("test_metrics")
    if metrics is None:
        metrics = {}
        if data.test is not None:
            metrics = evaluate(model, data.test, "test_")
            if data.full is not None:  # a run on the changed rows: the whole test split too
                metrics.update(evaluate(model, data.full, data.full_prefix))
        for name, split in getattr(data, "source_tests", {}).items():  # data.sources' own
            metrics.update(evaluate(model, split, f"test_{name}_"))
        if metrics:
            check_finite(metrics=metrics, learning_rate=exp.train.learning_rate)
        skipped = data.bad_images_skipped()  # data.on_bad_image=skip: rows dropped, every read
        if skipped:
            log.warning("Skipped %d undecodable image(s) (counted over every epoch read).", skipped)
            metrics["data.bad_images_skipped"] = float(skipped)
        if chief:
            if metrics:
                tracking.log_metrics(metrics)
            folder.record_finishing(test_metrics=metrics)
    if exp.runtime.strategy in ("horovod", "multiworker") and run.world.size > 1:
        # Every rank's test shard evaluated before the chief logs the model and marks the run
        # COMPLETE: a rank that failed (say its host lost the store) fails this collective on
        # the chief too, and the rerun trains nothing and evaluates again, instead of finding
        # the run COMPLETE and training it all over. (The multi-worker strategy's evaluate
        # already reduces its metrics over the workers; this meeting also covers what follows.)
        from keras_dl.distribute.collective import allreduce_mean

        allreduce_mean({"evaluated": 1.0}, prefix="finish")
    if not chief:
        return metrics, None, None, None
    model_uri, version = done.get("model_uri"), done.get("registered_version")
    if exp.tracking.log_model and model_uri is None:
        # Packed features: the logged model takes the named columns (frame_model.serving_model).
        serving = serving_model(model, data.plan)
        model_uri, _ = publish.log_keras_model(serving, _sample_input(data), None)
        folder.record_finishing(model_uri=model_uri)
    name, refused = exp.tracking.registered_model, None
    if model_uri is not None and version is None and name and name != "none":
        version, refused = register_earned(exp, model, data, metrics, run_id, model_uri)
        if version is not None:
            folder.record_finishing(registered_version=version)
    alias = exp.registry.set_alias
    if version is not None and alias and done.get("alias") != alias:
        tracking.client().set_registered_model_alias(name, alias, str(version))
        folder.record_finishing(alias=alias)
    if refused is not None:
        return metrics, model_uri, None, refused  # not COMPLETE: a rerun decides again
    checkpoint.checkpoints.mark_complete(checkpoint.global_step)
    folder.clear_finishing()  # served its purpose
    return metrics, model_uri, version, None


def source_lineage(sources) -> dict[str, str]:
    """The lineage tags of a mixed split: ``data.sources`` (``name=table@version`` of every
    source, comma-separated) and each source's own tags as ``data.source.<name>.<key>``."""
    if not sources:
        return {}
    tags = {}
    for s in sources:
        for key, value in s.snapshot.lineage.items():
            tags[f"data.source.{s.name}.{key.removeprefix('data.')}"] = value
        tags[f"data.source.{s.name}.weight"] = f"{s.weight:g}"
    tags["data.sources"] = ",".join(
        f"{s.name}={s.snapshot.uri}@{s.snapshot.lineage['data.version']}" for s in sources
    )
    return tags


def evaluate(model, split, prefix: str) -> dict[str, float]:
    """``model``'s metrics on ``split``, each named ``prefix`` + Keras' name."""
    scores = model.evaluate(split.dataset, steps=split.steps, return_dict=True, verbose=0)
    return {f"{prefix}{k}": float(v) for k, v in scores.items()}


def register_earned(exp, model, data, metrics, run_id, model_uri) -> tuple[int | None, str | None]:
    """Register the logged model when the gate passes it: ``(version, None)``, or
    ``(None, reason)`` with the run tagged ``keras_dl.not_registered``."""
    decision = gate.decide(exp, model, data, metrics)
    if decision.metrics:  # the champion's figures (and the whole validation split's)
        tracking.log_metrics(dict(decision.metrics))
    tracking.set_tag(tracking.GATE_TAG, tracking.failure_text(decision.summary))
    name = exp.tracking.registered_model
    if not decision.passed:
        reason = f"not registered as {name}: {decision.reason}"
        tracking.set_tag(tracking.NOT_REGISTERED_TAG, tracking.failure_text(reason))
        log.warning("The model is %s.", reason)
        return None, reason
    client = tracking.client()
    if tracking.NOT_REGISTERED_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, tracking.NOT_REGISTERED_TAG)  # refused by an earlier attempt
    lineage = {**data.snapshot.lineage, "keras_dl.recipe": exp.recipe, "run_id": run_id}
    # The training manifest, the data's fingerprints and the warm start (keras-dl lineage).
    lineage.update(version_tags(client.get_run(run_id).data.tags))
    lineage.update(source_lineage(getattr(data, "sources", ())))
    scores = {f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()}
    version = publish.register_model(
        model_uri,
        name,
        tags={**lineage, **scores, tracking.GATE_TAG: tracking.failure_text(decision.summary)},
        description=tracking.describe_version(exp, lineage, metrics),
    )
    return version, None


def _sample_input(data, rows: int = 5):
    """A few rows of model input, as numpy, for the model signature."""
    split = data.test or data.validation or data.train
    features = next(iter(split.dataset.take(1)))
    if isinstance(features, tuple):
        features = features[0]
    if isinstance(features, dict):  # named columns, packed features unpacked
        return unpack({k: v.numpy()[:rows] for k, v in features.items()}, data.plan)
    return features.numpy()[:rows]
