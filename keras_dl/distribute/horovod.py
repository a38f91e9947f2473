"""Horovod for Keras 3, written on ``horovod.tensorflow``'s collective ops.

Upstream ``horovod.tensorflow.keras`` (0.28.1) does not work with Keras 3, nor do
``hvd.broadcast_variables`` and ``hvd.DistributedGradientTape``. What does work is
``hvd.grouped_allreduce`` inside the compiled train step and ``hvd.broadcast`` on eager tensors,
so the Keras 3 integration is built here on those two:

* :func:`distributed_optimizer` wraps any Keras optimizer so that every rank applies the
  *average* of all ranks' gradients (one grouped allreduce per step, optionally fp16 on the wire).
* :func:`broadcast_variables` copies rank 0's values into every rank's variables.
* The callbacks in :mod:`keras_dl.callbacks.horovod` broadcast the initial (or resumed) state
  and average the epoch metrics across ranks.

Use it in your own ``model.fit`` under ``horovodrun`` or :class:`~keras_dl.launch.HorovodRunner`::

    import keras
    from keras_dl.distribute import horovod as khvd
    from keras_dl.callbacks.horovod import BroadcastState, MetricAverage

    hvd = khvd.init()                                  # every rank: join the Horovod world
    model = make_model()
    opt = khvd.distributed_optimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)   # Horovod ops cannot be XLA-compiled
    model.fit(shard_of_data, epochs=3, steps_per_epoch=same_on_every_rank,
              callbacks=[MetricAverage(), BroadcastState()],
              verbose=1 if hvd.rank() == 0 else 0)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from keras_dl.distribute.gpus import assigned_by_spark
from keras_dl.errors import DistributedError

# pip cannot build Horovod 0.28.1 against TensorFlow 2.21 (so there is no keras-dl[horovod]
# extra): the checkout's script patches and builds it against the venv's own TensorFlow.
_INSTALL_HINT = (
    "Horovod must be built with TensorFlow and Gloo support, which pip cannot do against "
    "TensorFlow 2.21 (there is no keras-dl[horovod] extra): in a keras-dl source checkout, run "
    f"`bash scripts/build_horovod.sh {sys.prefix}` (this venv; it needs pip, g++ and cmake), or "
    "`make setup` for the checkout's own .venv; or pick another runtime.strategy (none, mirrored)."
)


def import_horovod():
    """Import ``horovod.tensorflow``, or raise a :class:`DistributedError` saying how to fix it.

    Returns:
        The ``horovod.tensorflow`` module.
    """
    try:
        import horovod.tensorflow as hvd
    except Exception as exc:  # ImportError, or a broken build (undefined symbol: OSError/NameError)
        raise DistributedError(
            f"runtime.strategy=horovod needs Horovod, but `import horovod.tensorflow` failed: "
            f"{type(exc).__name__}: {exc}. {_INSTALL_HINT}"
        ) from exc
    return hvd


def init():
    """Initialize Horovod in this process (idempotent) and return ``horovod.tensorflow``.

    Every rank calls this before building its data or model: it is what gives the process its
    rank and size (see :func:`keras_dl.distribute.world.current_world`).
    """
    hvd = import_horovod()
    if not hvd.is_initialized():
        # Collective: blocks until every rank of the job has joined the Gloo rendezvous.
        hvd.init()
        _pin_gpu(gpu_index(hvd.local_rank()))
    return hvd


def gpu_index(local_rank: int) -> int:
    """Index, among the GPUs this process sees, of the one a rank with ``local_rank`` trains on.

    A rank of a Spark task that was given GPUs sees only those (``CUDA_VISIBLE_DEVICES``, set by
    :func:`keras_dl.distribute.gpus.use_task_gpus`): it takes the first, whatever its local rank.
    Otherwise (local ranks, Spark without GPU scheduling), rank ``local_rank`` takes GPU
    ``local_rank``, as Horovod does.
    """
    return 0 if assigned_by_spark() else local_rank


def _pin_gpu(index: int) -> None:
    """One GPU per process: this process sees only its GPU number ``index`` (modulo the count)."""
    import logging

    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    try:
        gpu = gpus[index % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
    except RuntimeError as exc:  # TF already initialized its devices in this process
        logging.getLogger(__name__).warning(
            "Could not pin GPU %d to this Horovod rank (%s): call keras_dl's init() before "
            "TensorFlow touches a device.",
            index,
            exc,
        )


def distributed_optimizer(optimizer, fp16_allreduce: bool = False):
    """Return ``optimizer`` wrapped so that it averages gradients across ranks before applying them.

    The result is an instance of a dynamic subclass of the optimizer's own class (carrying its
    state and config), so ``model.compile``, ``isinstance`` checks, mixed-precision loss scaling
    and saving the model all behave as with the original optimizer; a saved model reloads with
    the plain optimizer class.

    Args:
        optimizer: A Keras 3 optimizer instance (a ``LossScaleOptimizer`` too: its finiteness
            check then sees the averaged gradients, so every rank skips the same steps).
        fp16_allreduce: Send float32 gradients as float16 over the wire (half the bytes, less
            precision). Defaults to False.

    Returns:
        The same optimizer object, re-classed in place (wrapping twice is a no-op).

    Example:
        >>> opt = distributed_optimizer(keras.optimizers.SGD(0.01 * hvd.size()))  # doctest: +SKIP
        >>> model.compile(optimizer=opt, loss="mse", jit_compile=False)            # doctest: +SKIP
    """
    if getattr(optimizer, "_keras_dl_distributed", False):
        return optimizer
    hvd = import_horovod()
    base = type(optimizer)
    compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if hvd.size() > 1:
            grads = _allreduce(hvd, grads, compression)
        return base.apply(self, grads, trainable_variables)

    # Same __name__ and __module__ as the original class: Keras serializes the optimizer under
    # its own name, so a saved model reloads without keras_dl (Horovod's Keras did the same).
    cls = type(
        base.__name__,
        (base,),
        {"apply": apply, "_keras_dl_distributed": True, "__module__": base.__module__},
    )
    optimizer.__class__ = cls
    return optimizer


def broadcast_variables(variables: Sequence, root_rank: int = 0, prefix: str = "var") -> None:
    """Overwrite ``variables`` on every rank with their values on ``root_rank``.

    Collective: every rank must call it with the same variables in the same order (Horovod
    matches the broadcasts by name). Runs eagerly, one broadcast per variable; Horovod's
    background thread fuses them into a few messages.

    Args:
        variables: Keras or TF variables (``model.variables``, ``optimizer.variables``).
        root_rank: The rank whose values win. Defaults to 0.
        prefix: Name prefix that keeps these broadcasts apart from others. Defaults to "var".
    """
    import tensorflow as tf

    hvd = import_horovod()
    if hvd.size() == 1:
        return
    for i, v in enumerate(variables):
        name = f"keras_dl.{prefix}.{i}.{_op_name(getattr(v, 'path', None) or v.name)}"
        value = hvd.broadcast(tf.convert_to_tensor(v), root_rank=root_rank, name=name)
        v.assign(value)


def average_variables(variables: Sequence, prefix: str = "stats") -> None:
    """Replace each floating-point variable by its mean over all ranks (collective).

    For the statistics that gradients do not synchronise, such as BatchNorm's moving mean and
    variance: each rank updates them from its own shard, so without this the ranks' models (and
    rank 0's checkpoints) would drift apart.

    Args:
        variables: Variables, in the same order on every rank.
        prefix: Name prefix for the allreduce op. Defaults to "stats".
    """
    import tensorflow as tf

    hvd = import_horovod()
    floats = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
    if hvd.size() == 1 or not floats:
        return
    # Collective: every rank sends its statistics and gets back the mean of all ranks'.
    means = hvd.grouped_allreduce(
        [tf.convert_to_tensor(v) for v in floats],
        op=hvd.Average,
        name=_op_name(f"keras_dl.{prefix}"),
    )
    for v, mean in zip(floats, means, strict=True):
        v.assign(mean)


def allreduce_mean(values: dict[str, float], prefix: str = "metrics") -> dict[str, float]:
    """Average a ``{name: number}`` dict across ranks (collective; same keys on every rank).

    Args:
        values: Numbers of this rank.
        prefix: Name prefix for the allreduce ops. Defaults to "metrics".

    Returns:
        ``{name: mean over ranks}`` with the same keys.
    """
    import numpy as np
    import tensorflow as tf

    hvd = import_horovod()
    if hvd.size() == 1 or not values:
        return dict(values)
    keys = sorted(values)
    # float64 so that averaging does not change single-rank values beyond float32 rounding.
    local = tf.constant([float(values[k]) for k in keys], dtype=tf.float64)
    mean = hvd.allreduce(
        local, op=hvd.Average, name=_op_name(f"keras_dl.{prefix}.{'.'.join(keys)}")
    )
    return dict(zip(keys, np.asarray(mean).tolist(), strict=True))


def allgather_rows(rows, prefix: str = "rows"):
    """Concatenate every rank's ``(n, k)`` float64 rows, in rank order (collective).

    Ranks may send different numbers of rows, none included; ``k`` must be the same everywhere.

    Args:
        rows: A numpy array of shape ``(n, k)`` on this rank.
        prefix: Name of the allgather op, the same on every rank for one call. Defaults to "rows".

    Returns:
        A numpy array ``(sum of n over ranks, k)``; ``rows`` itself in a single process.
    """
    import numpy as np
    import tensorflow as tf

    hvd = import_horovod()
    rows = np.asarray(rows, dtype=np.float64)
    if hvd.size() == 1:
        return rows
    # Collective: every rank sends its rows and gets back all ranks' rows, rank 0's first.
    gathered = hvd.allgather(tf.constant(rows), name=_op_name(f"keras_dl.{prefix}"))
    return np.asarray(gathered)


def _allreduce(hvd, grads: list, compression) -> list:
    """Average ``grads`` over ranks with one grouped allreduce (inside the compiled train step)."""
    import tensorflow as tf

    present = [i for i, g in enumerate(grads) if g is not None]
    # Sparse gradients (embeddings) are densified: a grouped allreduce takes dense tensors, and
    # every rank must send tensors of the same shape.
    dense = [tf.convert_to_tensor(grads[i]) for i in present]
    if not dense:
        return grads
    # Collective: every rank contributes its local gradients and receives the mean of all ranks'.
    reduced = hvd.grouped_allreduce(dense, op=hvd.Average, compression=compression)
    out = list(grads)
    for i, g in zip(present, reduced, strict=True):
        out[i] = g
    return out


def _op_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name))
