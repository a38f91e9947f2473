"""What ``model.compile`` gets when the training rows carry sample weights.

The training split is weighted (``SplitData.weighted``) when ``data.weight_column`` or
``train.class_weight`` weigh rows, or when padding at weight 0 gives every rank equal steps.
Then the recipe's metrics are compiled as weighted metrics (only those count the weights) and
its losses divide by the rows of weight > 0, not by every slot of the batch
(:func:`keras_dl.distribute.padding.exclude_padding`): a padded batch updates the model as its
real rows alone would.
"""

from __future__ import annotations


def weigh_rows(options: dict, weighted: bool) -> dict:
    """``options`` (``model.compile``'s keyword arguments) for weighted training rows.

    Args:
        options: ``loss``, ``metrics`` and the recipe's other compile options.
        weighted: Whether the training batches carry sample weights.

    Returns:
        A new dict: unchanged when not ``weighted``; else ``metrics`` moved to
        ``weighted_metrics`` (a dict per output head stays a dict) and ``loss`` wrapped.
    """
    options = dict(options)
    if not weighted:
        return options
    from keras_dl.distribute.padding import exclude_padding

    if options.get("metrics"):
        weighted_metrics = options.pop("metrics")
        if isinstance(weighted_metrics, dict):  # per output head (several labels)
            options["weighted_metrics"] = weighted_metrics
        else:
            extra = options.get("weighted_metrics") or []
            options["weighted_metrics"] = [*weighted_metrics, *extra]
    if options.get("loss") is not None:
        options["loss"] = exclude_padding(options["loss"])
    return options


def compile_weighted(model, options: dict, weighted: bool) -> None:
    """``model.compile(**weigh_rows(options, weighted))``, saving the recipe's own losses.

    The saved model (the logged one, a checkpoint) records the losses the recipe gave, not
    their wrappers: it loads and compiles where keras_dl is not imported, and the wrappers
    change only how training divides a batch's loss.
    """
    model.compile(**weigh_rows(options, weighted))
    saved = getattr(model, "_compile_config", None)  # Keras 3: what get_compile_config saves
    if weighted and isinstance(getattr(saved, "config", None), dict) and "loss" in saved.config:
        saved.config["loss"] = options.get("loss")
