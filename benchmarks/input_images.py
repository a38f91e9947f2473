"""The image paths ``keras-dl bench input`` compares: Petastorm's codec, tf.data decoding the same
JPEG bytes from memory, and keras_dl (streaming and cached), each timed as ``fit`` consumes data.
"""

from __future__ import annotations

import numpy as np

from benchmarks.input_paths import (
    CACHE_BYTES,
    SUBJECTS,
    _closing,
    consume_split,
    keras_dl_images,
)
from benchmarks.timing import consume, measure_rounds, summarize

IMAGE_PATHS = ("petastorm_codec", "in_memory_decode", "keras_dl", "keras_dl_cached")


def measure_images(url: str, delta: str, batches: list[int], rounds: int = 3) -> dict:
    """Petastorm's codec path, tf.data decoding bytes from memory, and keras_dl, on one set."""
    import pyarrow.parquet as pq

    from keras_dl.data import open_table

    snapshot = open_table(delta)
    table = pq.read_table(list(snapshot.files))  # the dataset reader on pyarrow 12 and 25 alike
    images = np.asarray(table.column("image").to_pylist(), dtype=object)
    labels = table.column("label").to_numpy()
    row_bytes = sum(len(b) for b in images) / len(images)
    out = {"rows": len(images), "bytes_per_row": round(row_bytes, 1), "batches": {}}
    for b in batches:
        cpu: dict = {}
        samples = measure_rounds(
            rounds,
            {
                "petastorm_codec": lambda b=b: petastorm_codec(url, b, len(images)),
                "in_memory_decode": lambda b=b: in_memory_decode(images, labels, b),
                "keras_dl": lambda b=b: consume_split(keras_dl_images(delta, b), b),
                "keras_dl_cached": lambda b=b: consume_split(
                    keras_dl_images(delta, b, CACHE_BYTES), b, cached=True
                ),
            },
            cpu,
        )
        out["batches"][str(b)] = summarize(samples, SUBJECTS, scale=row_bytes, cpu=cpu)
    return out


def petastorm_codec(url: str, batch: int, rows: int) -> float:
    """Images/s of Petastorm's image path: ``make_reader`` decodes each JPEG with its codec."""
    import tensorflow as tf
    from petastorm import make_reader
    from petastorm.tf_utils import make_petastorm_dataset

    with _closing(make_reader(url, workers_count=2, num_epochs=None)) as reader:
        ds = make_petastorm_dataset(reader).batch(batch)
        ds = ds.map(lambda r: (tf.cast(r.image, tf.float32) / 255.0, r.label)).prefetch(-1)
        return consume(ds, max(1, rows // batch)) * batch


def in_memory_decode(images: np.ndarray, labels: np.ndarray, batch: int) -> float:
    """Images/s of tf.data decoding the same bytes from memory, per image, AUTOTUNE-parallel."""
    import tensorflow as tf

    from benchmarks.input_tables import IMAGE_SIZE

    def decode(encoded, label):
        # The images are stored at IMAGE_SIZE: decode and scale, as a user would write it.
        img = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        img = tf.ensure_shape(img, (IMAGE_SIZE, IMAGE_SIZE, 3))
        return tf.cast(img, tf.float32) / 255.0, label

    ds = tf.data.Dataset.from_tensor_slices((images.astype(bytes), labels)).repeat()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(-1)
    return consume(ds, max(1, len(images) // batch)) * batch
