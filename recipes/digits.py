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

from keras_dl.config import DataConfig, Experiment, TrainConfig
from keras_dl.recipe import Recipe

# ## Defaults


@dataclass(frozen=True)
class DigitsModel:
    """The CNN's size.

    Args:
        filters: Filters of the first conv layer (the second has twice as many). Defaults to 32.
        dense: Units of the hidden dense layer. Defaults to 128.
        dropout: Dropout before the classifier. Defaults to 0.3.
        num_classes: Output classes. Defaults to 10.
    """

    filters: int = 32
    dense: int = 128
    dropout: float = 0.3
    num_classes: int = 10


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
    x = layers.Conv2D(m.filters, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(m.filters, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(2 * m.filters, 3, padding="same", activation="relu")(x)
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
)

# ## Run it

if __name__ == "__main__":
    from keras_dl.cli import run_recipe

    raise SystemExit(run_recipe("digits"))
