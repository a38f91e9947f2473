"""One worker of a two-worker MultiWorkerMirroredStrategy job, for test_multiworker_keras.

``python -m tests.distribute.mwms_fit MODE OUT``, with ``TF_CONFIG`` set: MODE ``plain`` is Keras 3
as TF's multi-worker tutorial uses it (a batched tf.data dataset, auto-shard off, ``model.fit``);
``keras_dl`` is the same through :mod:`keras_dl.distribute.multiworker`. Each worker trains its
own 48 rows (seeded by its index) with 16 rows of weight 0 as padding. OUT gets a JSON report:
the error ``fit`` raised, or the history and the weights' digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

HEARTBEAT = 45.0


def main(mode: str, out: str) -> None:
    import numpy as np
    import tensorflow as tf

    if mode == "keras_dl":
        from keras_dl.distribute import multiworker, mw_coordination

        strategy = multiworker.init(HEARTBEAT)  # runtime.stall_timeout's place
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()

    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    dataset = tf.data.Dataset.from_tensor_slices(shard(rank)).batch(8)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    if mode == "keras_dl":
        dataset = multiworker.worker_dataset(strategy, dataset)
    with strategy.scope():
        model = make_model()
    report = {"rank": rank, "replicas": strategy.num_replicas_in_sync}
    if mode == "keras_dl":  # TF's coordination service waits that long for a silent worker
        report["heartbeat"] = mw_coordination.heartbeat_timeout_seconds()
    try:
        history = model.fit(dataset, epochs=2, steps_per_epoch=8, verbose=0, shuffle=False)
    except Exception as exc:  # what plain Keras 3 raises: the report says which
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    else:
        report["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
        digest = hashlib.sha256()
        for w in model.get_weights():
            digest.update(np.ascontiguousarray(w).tobytes())
        report["digest"] = digest.hexdigest()
        report["weights"] = [w.tolist() for w in model.get_weights()]
    with open(out, "w") as f:
        json.dump(report, f)


def shard(rank: int):
    """Worker ``rank``'s rows: 48 real ones, then 16 copies at weight 0 (padding)."""
    import numpy as np

    x = np.random.default_rng(rank).normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    weight = np.where(np.arange(64) < 48, 1.0, 0.0).astype("float32")
    return x, y, weight


def make_model():
    """The same tiny classifier on every worker (and in the test's one process)."""
    import keras

    keras.utils.set_random_seed(0)  # the same seed everywhere: MWMS broadcasts worker 0's
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
