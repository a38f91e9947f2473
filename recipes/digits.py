"""
Title: digits, a small CNN on scikit-learn's 8x8 handwritten digits
Description: the fastest end-to-end example: a Delta table of raw pixels -> Keras CNN -> MLflow.

Make the table, then train::

    keras-dl ingest sklearn-digits --to data/digits
    python -m recipes.digits --set data.table=data/digits

The model takes raw pixels (64 values, 0-16) and rescales them itself, so the registered model
serves and scores raw pixel rows with no preprocessing on the caller's side.
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_dl.config import DataConfig, Experiment, TrainConfig, bounded
from keras_dl.recipe import Recipe, check_num_classes
from recipes import _examples

# ## Defaults


@dataclass(frozen=True)
class DigitsModel:
    """The CNN's size.

    Args:
        filters: Filters of the first conv layer (the second has twice as many). Defaults to 32.
        dense: Units of the hidden dense layer. Defaults to 128.
        dropout: Dropout before the classifier. Defaults to 0.3.
        num_classes: Output classes. Defaults to 10.
        shift: Random translation while training, as a fraction of the 8 pixels (one pixel).
            Defaults to 0.125.
        batch_norm: Batch normalization after each conv layer. Defaults to True.
    """

    # Each range is checked when the config is resolved (keras_dl.config.bounds), before any
    # run starts; num_classes is also checked against the table's labels (RECIPE.check).
    filters: int = bounded(32, 1)
    dense: int = bounded(128, 1)
    dropout: float = bounded(0.3, 0, 1, high_open=True)
    num_classes: int = bounded(10, 2)
    shift: float = bounded(0.125, 0, 1)
    batch_norm: bool = True


DEFAULTS = Experiment(
    recipe="digits",
    data=DataConfig(table="data/digits", label="label", features=("pixels",), split_column="split"),
    train=TrainConfig(epochs=30, batch_size=32, learning_rate=1e-3, lr_schedule="cosine"),
    model=DigitsModel(),
)

# ## The model


def build_model(data, exp: Experiment):
    """A two-block CNN over the 8x8 image, rescaling raw 0-16 pixels inside the model."""
    import keras
    from keras import layers

    m: DigitsModel = exp.model
    inputs = keras.Input(shape=(64,), name="pixels")
    x = layers.Rescaling(1.0 / 16.0)(inputs)
    x = layers.Reshape((8, 8, 1))(x)
    if m.shift:
        # Inactive at inference, so the served model still takes the raw pixels as they are.
        x = layers.RandomTranslation(m.shift, m.shift, fill_mode="constant", seed=exp.train.seed)(x)
    for filters, pool in ((m.filters, False), (m.filters, True), (2 * m.filters, True)):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=not m.batch_norm)(x)
        if m.batch_norm:
            # momentum 0.9: the moving statistics settle within the ~40 steps of an epoch here.
            x = layers.BatchNormalization(momentum=0.9)(x)
        x = layers.Activation("relu")(x)
        if pool:
            x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dense(m.dense, activation="relu")(x)
    x = layers.Dropout(m.dropout)(x)
    # float32 output keeps the softmax stable under mixed precision.
    outputs = layers.Dense(m.num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


RECIPE = Recipe(
    name="digits",
    description="small CNN on scikit-learn's 8x8 digits (Delta table from `keras-dl ingest sklearn-digits`)",
    defaults=DEFAULTS,
    build_model=build_model,
    check=check_num_classes,  # model.num_classes against the labels, before any run
    example=_examples.digits,  # a small table it trains on, made offline
)

# ## Run it

if __name__ == "__main__":
    from keras_dl.cli import run_recipe

    raise SystemExit(run_recipe("digits"))
