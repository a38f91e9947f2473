"""The tables, models and feeds of ``keras-dl bench fit``, and one timed fit.

Every feed hands ``fit`` the same structure: the wide table as ``({column: (B,)}, label)`` (one
model input per column), or packed (``data.pack_features``, the tabular recipe's default) as
``({"__packed_float32": (B, 200)}, label)``, and the images as
``((B, 64, 64, 3) float32 in 0..1, label)``.
"""

from __future__ import annotations

import numpy as np

from benchmarks.input_tables import IMAGE_SIZE, WIDE_COLUMNS
from keras_dl.data.hooks import PACKED as PACKED_PREFIX

MLP_UNITS = (1024, 1024)  # compute-bound at batch 256 on 2 cores: tens of ms per step
CNN_FILTERS = (16, 32, 32)
# data.pack_features' name for the wide table's 200 float32 columns
PACKED = f"{PACKED_PREFIX}float32"


def write_table(table: str, path: str, rows: int, rows_per_group: int) -> str:
    """Write the setup's Delta table: ``wide`` (200 floats + label) or ``images`` (JPEGs)."""
    from benchmarks import input_tables

    if table == "wide":
        return input_tables.write_wide(path, rows, rows_per_group, label=True)
    return input_tables.write_images_delta(path, rows, rows_per_group)


def make_model(table: str, pack: bool = False):
    """A compiled compute-bound model for the table: an MLP (wide) or a small CNN (images).

    Args:
        pack: The MLP takes the 200 columns packed, as one ``(200,)`` input.
    """
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    if table == "wide":
        if pack:
            inputs = {PACKED: keras.Input(shape=(WIDE_COLUMNS,), dtype="float32", name=PACKED)}
            x = inputs[PACKED]
        else:
            names = [f"c{j:03d}" for j in range(WIDE_COLUMNS)]
            inputs = {n: keras.Input(shape=(), dtype="float32", name=n) for n in names}
            x = keras.ops.stack([inputs[n] for n in names], axis=1)
        for units in MLP_UNITS:
            x = layers.Dense(units, activation="relu")(x)
        name = ("mlp_packed_" if pack else "mlp_") + "x".join(map(str, MLP_UNITS))
    else:
        inputs = keras.Input(shape=(IMAGE_SIZE, IMAGE_SIZE, 3), name="image")
        x = inputs
        for i, filters in enumerate(CNN_FILTERS):
            x = layers.Conv2D(filters, 3, strides=1 if i == 0 else 2, activation="relu")(x)
        x = layers.GlobalAveragePooling2D()(x)
        name = "cnn_" + "_".join(map(str, CNN_FILTERS))
    outputs = layers.Dense(10)(x)
    model = keras.Model(inputs, outputs, name=name)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def keras_dl_feed(table: str, path: str, batch: int, cache: bool = True, pack: bool = False):
    """keras_dl's training pipeline over the table, a new one each call.

    Args:
        pack: ``data.pack_features``: the wide table's 200 float columns as one tensor.
        cache: ``data.cache=auto`` with its default budget, as a run gets it (these tables fit:
            from the second epoch on, no reader runs). False: every epoch read from the table.
    """
    from benchmarks.input_paths import keras_dl_dataset, keras_dl_images
    from keras_dl.config import DataConfig

    budget = DataConfig().cache_max_bytes if cache else 0
    if table == "wide":
        return keras_dl_dataset(path, batch, "label", budget, pack=pack).dataset
    return keras_dl_images(path, batch, budget).dataset


def in_memory_feed(table: str, path: str, batch: int, pack: bool = False):
    """Read and decode the table once; return a function making the in-memory dataset.

    The batches are sliced whole from ``(steps, B, ...)`` tensors: no per-row work, no reader.

    Args:
        pack: The wide table's columns packed, as keras_dl packs them.
    """
    import tensorflow as tf

    from benchmarks.input_paths import packed_plan, read_columns
    from keras_dl.data import open_table
    from keras_dl.data.hooks import pack as pack_columns

    snapshot = open_table(path)
    columns = read_columns(snapshot)
    label = columns.pop("label").astype(np.int64)
    if table == "wide" and pack:
        features = pack_columns(columns, packed_plan(snapshot, "label"))
    elif table == "wide":
        features = columns
    else:
        decoded = [tf.io.decode_jpeg(b, channels=3).numpy() for b in columns["image"]]
        features = np.stack(decoded).astype(np.float32) / 255.0
    steps = len(label) // batch

    def shaped(a):
        return a[: steps * batch].reshape(steps, batch, *a.shape[1:])

    data = (tf.nest.map_structure(shaped, features), shaped(label))

    def make():
        return tf.data.Dataset.from_tensor_slices(data).repeat().prefetch(tf.data.AUTOTUNE)

    return make


def peer_feed(table: str, path: str, batch: int, how: str, pack: bool = False):
    """A peer's feed of the same rows, a new dataset each call, one pass per epoch.

    Args:
        pack: The wide table's columns stacked into one ``(B, 200)`` tensor in tf.data, as a
            user feeding a model with one input would add it.
        how: "ray_to_tf" (Ray Data's ``read_parquet(files).to_tf`` with a local shuffle buffer)
            or "hand_written" (pyarrow ``iter_batches`` into ``from_generator``). The images
            are decoded in tf.data (``decode_jpeg``, AUTOTUNE-parallel), as a user would add it.
    """
    import tensorflow as tf

    from benchmarks import input_peers
    from keras_dl.data import open_table

    files = list(open_table(path).files)
    names = [f"c{j:03d}" for j in range(WIDE_COLUMNS)] if table == "wide" else ["image"]
    if how == "ray_to_tf":
        ds = input_peers.ray_dataset(files).to_tf(
            feature_columns=names if table == "wide" else "image",
            label_columns="label",
            batch_size=batch,
            local_shuffle_buffer_size=input_peers.RAY_SHUFFLE_ROWS,
        )
    else:
        rng = np.random.default_rng(0)

        def batches():
            for rb in input_peers.record_batches(files, batch, rng):
                x = {n: rb.column(n).to_numpy(zero_copy_only=False) for n in names}
                yield (x if table == "wide" else x["image"]), rb.column("label").to_numpy()

        x_spec = tf.TensorSpec((None,), tf.float32 if table == "wide" else tf.string)
        spec = (
            {n: x_spec for n in names} if table == "wide" else x_spec,
            tf.TensorSpec((None,), tf.int64),
        )
        ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
    if table == "wide" and pack:

        def stack(x, label):
            return {PACKED: tf.stack([tf.cast(x[n], tf.float32) for n in names], axis=1)}, label

        ds = ds.map(stack, num_parallel_calls=tf.data.AUTOTUNE)
    elif table != "wide":

        def decode(images, label):
            one = tf.TensorSpec((IMAGE_SIZE, IMAGE_SIZE, 3), tf.uint8)
            pixels = tf.map_fn(
                lambda b: tf.io.decode_jpeg(b, channels=3), images, fn_output_signature=one
            )
            return tf.cast(pixels, tf.float32) / 255.0, label

        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.repeat().prefetch(tf.data.AUTOTUNE)


def fit_epochs(model, dataset, batch: int, steps: int) -> dict[str, float]:
    """Fit two epochs of ``steps`` from ``dataset``; the second epoch's Throughput figures.

    The first epoch traces the step (once per model), starts the reader and, with
    ``data.cache``, fills the cache; with ``steps`` one pass over the table, the second epoch
    is the table's second epoch. The input wait is measured on every step.
    """
    from keras_dl.callbacks import Throughput

    tp = Throughput(batch_size=batch, wait_every_n_steps=1)
    cpu = _EpochCPU()
    history = model.fit(
        tp.instrument(dataset),
        epochs=2,
        steps_per_epoch=steps,
        callbacks=[tp, cpu],
        shuffle=False,  # the feeds shuffle (or not) themselves
        verbose=0,
    )
    out = {k: float(v[-1]) for k, v in history.history.items() if k != "loss"}
    out["cpu_ms_per_sample"] = 1000.0 * cpu.seconds / (steps * batch)
    return out


class _EpochCPU:
    """CPU seconds of this process (all threads, and within
    :func:`benchmarks.timing.counting_descendants` its child processes) over the last epoch.

    On a shared machine wall time swings with other people's load; the CPU this process spent
    per sample does much less, and keras_dl's excess over in-memory is its input pipeline's cost.
    """

    def __new__(cls):
        import keras

        from benchmarks.timing import cpu_seconds

        class EpochCPU(keras.callbacks.Callback):
            seconds = 0.0

            def on_epoch_begin(self, epoch, logs=None):
                self._start = cpu_seconds()

            def on_epoch_end(self, epoch, logs=None):
                self.seconds = cpu_seconds() - self._start

        return EpochCPU()
