"""The collectives keras_dl's callbacks run between the processes of a job, whichever engine
joined them: Horovod (:mod:`keras_dl.distribute.horovod`) or TF's MultiWorkerMirroredStrategy
(:mod:`keras_dl.distribute.multiworker`).

Each function has the signature of its Horovod counterpart, and under Horovod is that function,
called with the same arguments. Under the multi-worker strategy it is an eager collective of the
strategy (``strategy.reduce`` / ``strategy.gather`` of a value each worker gives), which, like
Horovod's, every worker must call in the same order; ``prefix`` (Horovod's op names) is not
needed there: TF matches eager collectives by their order. With one process they return at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_dl.distribute import horovod as khvd
from keras_dl.distribute import multiworker


def size() -> int:
    """Processes in this job: the workers of the multi-worker strategy, Horovod's ranks, or 1."""
    world = multiworker.world()
    if world is not None:
        return world.size
    import sys

    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        return hvd.size()
    return 1


def allreduce_mean(values: dict[str, float], prefix: str = "metrics") -> dict[str, float]:
    """A ``{name: number}`` dict averaged over the processes (same keys everywhere)."""
    strategy = multiworker.current_strategy()
    if strategy is None:
        return khvd.allreduce_mean(values, prefix=prefix)
    import numpy as np
    import tensorflow as tf

    if not values:
        return dict(values)
    keys = sorted(values)
    local = tf.constant([float(values[k]) for k in keys], dtype=tf.float64)
    mean = strategy.reduce("MEAN", _given(strategy, local), axis=None)
    return dict(zip(keys, np.asarray(mean).tolist(), strict=True))


def allgather_rows(rows, prefix: str = "rows"):
    """Every process's ``(n, k)`` float64 rows, concatenated in rank order (``n`` may differ)."""
    strategy = multiworker.current_strategy()
    if strategy is None:
        return khvd.allgather_rows(rows, prefix=prefix)
    import numpy as np
    import tensorflow as tf

    rows = tf.constant(np.asarray(rows, dtype=np.float64).reshape(-1, np.shape(rows)[-1]))
    return np.asarray(strategy.gather(_given(strategy, rows, once=True), axis=0))


TEXT_BYTES = 256  # the longest text allgather_text carries (a host name is at most 253)


def allgather_text(text: str, prefix: str = "text") -> list[str]:
    """Every process's ``text`` (at most :data:`TEXT_BYTES` bytes of UTF-8), in rank order.

    Sent as numbers through :func:`allgather_rows`, never pickled: nothing a peer sends is
    run as code (Horovod's ``allgather_object`` unpickles what each rank sends).
    """
    import numpy as np

    raw = text.encode()[:TEXT_BYTES]
    codes = np.zeros((1, TEXT_BYTES + 1), dtype=np.float64)
    codes[0, 0] = len(raw)
    codes[0, 1 : len(raw) + 1] = np.frombuffer(raw, dtype=np.uint8)
    out = []
    for row in allgather_rows(codes, prefix=prefix):
        n = int(row[0])
        out.append(bytes(row[1 : n + 1].astype(np.uint8)).decode(errors="replace"))
    return out


def broadcast_variables(variables: Sequence, root_rank: int = 0, prefix: str = "var") -> None:
    """Overwrite ``variables`` everywhere with their values on ``root_rank``."""
    strategy = multiworker.current_strategy()
    if strategy is None:
        return khvd.broadcast_variables(variables, root_rank=root_rank, prefix=prefix)
    import tensorflow as tf

    root = multiworker.world().rank == root_rank
    for v in variables:
        value = tf.convert_to_tensor(v)
        # A sum where only the root gives its value and every other replica zeros: exact.
        mine = value if root else tf.zeros_like(value)
        v.assign(strategy.reduce("SUM", _given(strategy, mine, once=True), axis=None))


def average_variables(variables: Sequence, prefix: str = "stats") -> None:
    """Replace each floating-point variable by its mean over the processes (BatchNorm's
    statistics, which each worker updates from its own shard)."""
    strategy = multiworker.current_strategy()
    if strategy is None:
        return khvd.average_variables(variables, prefix=prefix)
    import tensorflow as tf

    for v in variables:
        if tf.as_dtype(v.dtype).is_floating:
            local = tf.convert_to_tensor(v)
            v.assign(strategy.reduce("MEAN", _given(strategy, local), axis=None))


def _given(strategy, value, once: bool = False):
    """``value`` as this worker's contribution to a collective: on each of its replicas, or
    (``once``) on its first only, the others giving zeros or no rows."""
    import tensorflow as tf

    local = len(strategy.extended.worker_devices)

    def per_replica(context):
        if not once or context.replica_id_in_sync_group % local == 0:
            return value
        if value.shape.rank == 2:
            return value[:0]  # no rows
        return tf.zeros_like(value)

    return strategy.experimental_distribute_values_from_function(per_replica)
