"""Warm start: a freshly built recipe model takes the weights of a registered model.

``--set model.init_from=models:/NAME@ALIAS`` (or ``models:/NAME/VERSION``) works for every
recipe: :func:`keras_dl.train.fit` builds and compiles the recipe's model as always, then calls
:func:`warm_start` inside the strategy's scope, before the resume. So a checkpoint restored
from ``runtime.run_dir`` overwrites these weights (an interrupted fine-tune continues where it
stopped, not from the registered model again), and under Horovod only rank 0 loads them: the
``BroadcastState`` callback copies rank 0's weights to every rank when ``fit`` starts, as it
does for a resume. Only the weights are taken; the optimizer starts fresh.

The run records the start: the param ``model.init_from`` as given, and the tags
``keras_dl.init_from`` (the pinned ``models:/NAME/VERSION`` the alias pointed at) and
``keras_dl.init_from.run_id`` (the run that trained it).
"""

from __future__ import annotations

from keras_dl.errors import ConfigError
from keras_dl.model.registry import Lineage, load_keras_model, resolve_model_uri

INIT_FROM_TAG = "keras_dl.init_from"
INIT_FROM_RUN_TAG = "keras_dl.init_from.run_id"


def warm_start(model, init_from: str, tracking_uri: str | None = None) -> Lineage:
    """Copy the weights of the registered model ``init_from`` into ``model``.

    Args:
        model: The freshly built (and compiled) recipe model.
        init_from: ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.
        tracking_uri: The MLflow store holding the registry. Defaults to
            ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``.

    Returns:
        The registered version the weights came from (name, version, run id).

    Raises:
        KerasDLError: An unknown registered model, version or alias (listing those there are).
        ConfigError: The registered model's weights do not fit ``model`` (other features or
            outputs, another architecture): names the URI, the layer and both shapes.
    """
    lineage = resolve_model_uri(init_from, tracking_uri)
    pinned = f"models:/{lineage.name}/{lineage.version}"
    source = load_keras_model(pinned)
    ours, theirs = list(model.weights), list(source.weights)
    where = f"model.init_from={init_from!r}" + (f" ({pinned})" if pinned != init_from else "")
    for mine, other in zip(ours, theirs):
        if tuple(mine.shape) != tuple(other.shape):
            raise ConfigError(
                f"{where} does not fit this model: layer {_layer(mine)!r} has weights "
                f"{_name(mine)!r} of shape {tuple(mine.shape)} here and {tuple(other.shape)} in "
                f"the registered model ({_name(other)!r}). Its features or outputs differ: train "
                "with the same data.features, data.label, data.pack_features and model "
                "settings, or drop model.init_from."
            )
    if len(ours) != len(theirs):
        extra = ours[len(theirs)] if len(ours) > len(theirs) else theirs[len(ours)]
        raise ConfigError(
            f"{where} does not fit this model: it has {len(theirs)} weight arrays and this model "
            f"{len(ours)} (first unmatched: {_name(extra)!r} of layer {_layer(extra)!r}). Train "
            "with the same recipe and model settings, or drop model.init_from."
        )
    import keras

    for mine, other in zip(ours, theirs):
        mine.assign(keras.ops.convert_to_numpy(other))
    return lineage


def init_from_tags(lineage: Lineage) -> dict[str, str]:
    """The tags that record the registered version a run started from."""
    return {
        INIT_FROM_TAG: f"models:/{lineage.name}/{lineage.version}",
        INIT_FROM_RUN_TAG: lineage.run_id,
    }


def _name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def _layer(variable) -> str:
    path = _name(variable)
    return path.rsplit("/", 1)[0] if "/" in path else path
