"""Each recipe's example: a small table it trains on, and the settings for a quick run.

``Recipe.example(folder)`` writes the table under ``folder`` and returns ``(table, sets)``:
``keras-dl train NAME --set data.table=TABLE --set ...`` then trains in seconds on a laptop.
The suite trains every recipe ``keras-dl recipes`` lists this way (tests/recipes/test_every.py),
and a new recipe gives its own example. Everything is made here, offline: no download.
"""

from __future__ import annotations

import os

import numpy as np


def digits(folder: str) -> tuple[str, tuple[str, ...]]:
    """scikit-learn's bundled 8x8 digits (1,797 rows, shipped with scikit-learn)."""
    from keras_dl.data.ingest import ingest_sklearn_digits

    table = os.path.join(folder, "digits")
    ingest_sklearn_digits(table, mode="ignore")
    return table, ("train.epochs=1",)


def tabular(folder: str, rows: int = 300) -> tuple[str, tuple[str, ...]]:
    """Houses: a numeric, an integer and a string feature; the label ``tier`` follows size."""
    import pyarrow as pa

    from keras_dl.data.ingest import write_table

    rng = np.random.default_rng(0)
    size = rng.normal(50.0, 20.0, rows)
    frame = {
        "size": size,
        "rooms": rng.integers(1, 6, rows).astype(np.int64),
        "city": rng.choice(["north", "south", "east"], rows),
        "tier": np.where(size > 50, "high", "low"),
    }
    table = os.path.join(folder, "houses")
    write_table(pa.table(frame), table, mode="ignore", rows_per_group=100)
    return table, ("data.label=tier", "train.epochs=1")


def flowers(folder: str, per_class: int = 12) -> tuple[str, tuple[str, ...]]:
    """A folder-per-class tree of small JPEGs (reddish and bluish noise), ingested as the
    flowers recipe's tables are (``keras-dl ingest images``); MobileNetV2 from scratch at
    32x32 (no pretrained weights: nothing is downloaded)."""
    import tensorflow as tf  # encodes the JPEGs: no OpenCV ([images]) needed

    from keras_dl.data.ingest.images import ingest_images

    rng = np.random.default_rng(0)
    root = os.path.join(folder, "flower_photos")
    for label, channel in (("blue", 2), ("red", 0)):  # RGB
        os.makedirs(os.path.join(root, label), exist_ok=True)
        for i in range(per_class):
            image = rng.integers(0, 96, (40, 40, 3), dtype=np.uint8)
            image[..., channel] += 150
            tf.io.write_file(os.path.join(root, label, f"{i}.jpg"), tf.io.encode_jpeg(image))
    table = os.path.join(folder, "flowers")
    ingest_images(root, table, mode="ignore", rows_per_group=8, resplit=(0.6, 0.2, 0.2))
    sets = (
        "data.image_size=32,32",
        "model.alpha=0.35",
        "model.weights=none",
        "model.num_classes=2",
        "train.batch_size=4",
        "train.epochs=1",
    )
    return table, sets
