"""Choose the ``tf.distribute`` strategy for ``runtime.strategy``.

``auto`` picks MirroredStrategy when there is more than one GPU and one device otherwise;
``mirrored`` mirrors over the visible GPUs, or over the logical CPU devices a test configured;
``horovod`` is one process per device, each with the default (one-device) strategy;
``multiworker`` is TF's MultiWorkerMirroredStrategy over the workers ``TF_CONFIG`` names, fixed
for Keras 3 (:mod:`keras_dl.distribute.multiworker`).
"""

from __future__ import annotations

from keras_dl.errors import ConfigError


def make_strategy(name: str, stall_timeout: float | None = None):
    """Return the strategy named by ``runtime.strategy``.

    ``stall_timeout`` (``runtime.stall_timeout``) bounds how long a multi-worker collective
    waits for a peer; the other strategies ignore it.
    """
    import tensorflow as tf

    if name == "multiworker":
        from keras_dl.distribute import multiworker

        return multiworker.init(stall_timeout)

    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        return tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    if name in ("none", "horovod"):
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus)
    raise ConfigError(
        f"runtime.strategy={name!r} is not one of auto, none, mirrored, horovod, multiworker."
    )


def use_logical_cpus(n: int) -> None:
    """Split the CPU into ``n`` logical devices (before TF initializes), to test mirroring."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )
