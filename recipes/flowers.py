"""
Title: flowers, transfer learning on a Keras application backbone
Description: the classic lakehouse example: JPEG bytes in a Delta table -> tf.data decode and
augment -> a pretrained backbone with a new head -> MLflow.

Make the table (TFDS downloads tf_flowers once), then train the head on a frozen backbone::

    keras-dl ingest tfds tf_flowers --to data/flowers --resplit 0.8,0.1,0.1
    python -m recipes.flowers --set data.table=data/flowers

Optionally fine-tune: a second run starts from the first one's weights, unfreezes the top of the
backbone and trains at a lower learning rate (its own MLflow run and registered version)::

    python -m recipes.flowers --set model.fine_tune_from=models:/flowers/1 \\
        --set model.fine_tune_layers=30 --set train.learning_rate=1e-5 --set train.epochs=5

Pretrained weights: ``model.weights=imagenet`` (the default) downloads them when online;
``model.weights=/path/to/backbone.weights.h5`` reads a local file; without either the backbone
trains from scratch, and the run says so loudly (and in its ``keras_dl.backbone_weights`` tag).
Images arrive as 0-255 floats (decoded, resized and, for training, augmented in tf.data by
``keras_dl.data.tables.images``); the model applies its backbone's own input scaling, so the
registered model takes 0-255 RGB images. ``--set train.mixed_precision=true`` trains in
mixed_float16 (the head's softmax stays float32).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from keras_dl.config import DataConfig, Experiment, TrainConfig, bounded
from keras_dl.data.stream.features import BINARY
from keras_dl.data.tables.images import make_image_preprocess
from keras_dl.errors import ConfigError
from keras_dl.recipe import Recipe, check_num_classes
from recipes import _examples

log = logging.getLogger(__name__)
IMAGE_SIZE = (224, 224)

# ## Defaults


@dataclass(frozen=True)
class FlowersModel:
    """The backbone, the head and the fine-tune stage.

    Args:
        backbone: A ``keras.applications`` class name. Defaults to "MobileNetV2".
        alpha: Width multiplier of MobileNet backbones (0.35 is tiny). Defaults to 1.0.
        weights: "imagenet" (download when online), a local ``.weights.h5`` file of the
            backbone, or "none" (from scratch). Defaults to "imagenet".
        num_classes: Output classes. Defaults to 5 (tf_flowers).
        dropout: Dropout before the classifier. Defaults to 0.2.
        fine_tune_from: Model to start from for the fine-tune stage (``models:/NAME/N``,
            ``models:/NAME@ALIAS``, or a ``.keras`` / ``.weights.h5`` file of this recipe's
            model); empty for the frozen stage. Defaults to "".
        fine_tune_layers: Backbone layers, from the top, trained in the fine-tune stage
            (BatchNormalization stays frozen). Defaults to 30.
    """

    backbone: str = "MobileNetV2"
    alpha: float = bounded(1.0, 0, low_open=True)
    weights: str = "imagenet"
    num_classes: int = bounded(5, 2)  # also checked against the table's labels (RECIPE.check)
    dropout: float = bounded(0.2, 0, 1, high_open=True)
    fine_tune_from: str = ""
    fine_tune_layers: int = bounded(30, 0)


DEFAULTS = Experiment(
    recipe="flowers",
    data=DataConfig(table="data/flowers", label="label", features=("image",), split_column="split"),
    train=TrainConfig(epochs=5, batch_size=32, learning_rate=1e-3),
    model=FlowersModel(),
)

# ## Input scaling each backbone family was trained with

_SCALING = {
    "tf": ("MobileNet", "MobileNetV2", "InceptionV3", "InceptionResNetV2", "Xception", "NASNet"),
    "caffe": ("ResNet50", "ResNet101", "ResNet152", "VGG16", "VGG19"),
    "torch": ("DenseNet",),
    # EfficientNet*, ConvNeXt*, MobileNetV3*, RegNet* rescale inside the application itself.
}

# ## The model


def build_model(data, exp: Experiment):
    """Backbone (frozen, inference-mode BatchNorm) + pooling + dropout + softmax head."""
    import keras
    from keras import layers

    m: FlowersModel = exp.model
    size = tuple(exp.data.image_size) or IMAGE_SIZE
    inputs = keras.Input(shape=(*size, 3), name="image")  # 0-255 RGB floats
    backbone, weights_used = _make_backbone(m, size)
    backbone.trainable = False
    x = _scale_inputs(inputs, m.backbone)
    x = backbone(x, training=False)  # BatchNorm keeps its statistics in both stages
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(m.dropout)(x)
    outputs = layers.Dense(m.num_classes, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs, outputs, name=f"flowers_{m.backbone.lower()}")
    if m.fine_tune_from:
        _load_stage_one(model, m.fine_tune_from)
        weights_used = f"fine-tuned from {m.fine_tune_from}"
        _unfreeze_top(backbone, m.fine_tune_layers)
    _record(weights_used, m)
    return model


RECIPE = Recipe(
    name="flowers",
    description="transfer learning (MobileNetV2 default) on JPEG bytes in Delta (`keras-dl ingest tfds tf_flowers`)",
    defaults=DEFAULTS,
    build_model=build_model,
    accept=(BINARY,),
    preprocess=make_image_preprocess("image", IMAGE_SIZE, normalize="none"),
    preprocess_train=make_image_preprocess("image", IMAGE_SIZE, normalize="none", augment=True),
    check=check_num_classes,  # model.num_classes against the labels, before any run
    example=_examples.flowers,  # a small table it trains on, made offline
)

# ## Helpers


def _make_backbone(m: FlowersModel, size: tuple[int, int]):
    """The application without its top, and a description of the weights it got."""
    import keras

    cls = getattr(keras.applications, m.backbone, None)
    if cls is None or not callable(cls):
        names = sorted(n for n in dir(keras.applications) if n[:1].isupper())
        raise ConfigError(
            f"model.backbone={m.backbone!r} is not a keras.applications model. Use one of: "
            f"{', '.join(names)}."
        )
    kwargs = {"include_top": False, "input_shape": (*size, 3)}
    if m.backbone.startswith("MobileNet"):
        kwargs["alpha"] = m.alpha
    if m.weights.lower() in ("", "none"):
        _shout(f"model.weights=none: the {m.backbone} backbone trains from scratch.")
        return cls(weights=None, **kwargs), "none"
    if m.weights != "imagenet":
        if not os.path.isfile(m.weights):
            raise ConfigError(
                f"model.weights={m.weights!r} is neither 'imagenet', 'none' nor an existing "
                "file. Point it at a .weights.h5 file of the backbone."
            )
        backbone = cls(weights=None, **kwargs)
        try:
            backbone.load_weights(m.weights)
        except Exception as exc:
            raise ConfigError(
                f"model.weights={m.weights!r} does not fit {m.backbone}(alpha={m.alpha}, "
                f"input {size}): {str(exc)[:300]}. Save it from the same backbone with "
                "backbone.save_weights('x.weights.h5')."
            ) from None
        return backbone, m.weights
    try:
        return cls(weights="imagenet", **kwargs), "imagenet"
    except Exception as exc:  # offline, or no ImageNet weights for this size/alpha
        _shout(
            f"Could not get ImageNet weights for {m.backbone} ({str(exc)[:200]}). TRAINING THE "
            "BACKBONE FROM SCRATCH: expect far lower accuracy. Pass a local file with --set "
            "model.weights=/path/backbone.weights.h5 to use pretrained weights offline."
        )
        return cls(weights=None, **kwargs), "none (ImageNet download failed)"


def _scale_inputs(x, backbone: str):
    import keras
    from keras import layers

    mode = next((k for k, names in _SCALING.items() if backbone.startswith(names)), None)
    if mode == "tf":
        return layers.Rescaling(1.0 / 127.5, offset=-1.0)(x)
    if mode == "caffe":  # BGR, ImageNet means subtracted
        return keras.ops.flip(x, axis=-1) - keras.ops.convert_to_tensor([103.939, 116.779, 123.68])
    if mode == "torch":
        x = layers.Rescaling(1.0 / 255.0)(x)
        return layers.Normalization(
            mean=[0.485, 0.456, 0.406], variance=[0.052441, 0.050176, 0.050625]
        )(x)
    return x


def _load_stage_one(model, source: str) -> None:
    """Copy the weights of the frozen-stage model (same recipe and settings) into ``model``."""
    import keras

    try:
        if source.startswith(("models:/", "runs:/")):
            import mlflow

            trained = mlflow.keras.load_model(source)
        elif source.endswith(".weights.h5"):
            model.load_weights(source)
            return
        else:
            trained = keras.saving.load_model(source, compile=False)
        model.set_weights(trained.get_weights())
    except Exception as exc:
        raise ConfigError(
            f"model.fine_tune_from={source!r} cannot be loaded into this model: "
            f"{str(exc)[:300]}. Use the frozen-stage run's model (same backbone, alpha, "
            "image size and classes)."
        ) from None


def _unfreeze_top(backbone, count: int) -> None:
    from keras import layers

    backbone.trainable = True
    for i, layer in enumerate(backbone.layers):
        top = i >= len(backbone.layers) - count
        layer.trainable = top and not isinstance(layer, layers.BatchNormalization)


def _record(weights_used: str, m: FlowersModel) -> None:
    """Tag the run (chief only: the only process with an active run) with the weights used."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.set_tags(
            {
                "keras_dl.backbone": m.backbone,
                "keras_dl.backbone_weights": weights_used,
                "keras_dl.stage": "fine-tune" if m.fine_tune_from else "frozen",
            }
        )


def _shout(message: str) -> None:
    bar = "!" * 100
    print(f"\n{bar}\nWARNING: {message}\n{bar}\n", file=sys.stderr, flush=True)
    log.warning(message)


# ## Run it

if __name__ == "__main__":
    from keras_dl.cli import run_recipe

    raise SystemExit(run_recipe("flowers"))
