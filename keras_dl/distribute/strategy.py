"""Choose the ``tf.distribute`` strategy for ``runtime.strategy``.

``auto`` picks MirroredStrategy when there is more than one GPU and one device otherwise;
``mirrored`` mirrors over the visible GPUs, or over the logical CPU devices a test configured;
``horovod`` is one process per device, each with the default (one-device) strategy.
"""

from __future__ import annotations

from keras_dl.errors import ConfigError


def make_strategy(name: str):
    """Return the strategy named by ``runtime.strategy``."""
    import tensorflow as tf

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
    raise ConfigError(f"runtime.strategy={name!r} is not one of auto, none, mirrored, horovod.")


def use_logical_cpus(n: int) -> None:
    """Split the CPU into ``n`` logical devices (before TF initializes), to test mirroring."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )
