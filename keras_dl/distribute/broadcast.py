"""Small integer records broadcast from rank 0 (collective): a resume's position, for example.

Only rank 0 reads checkpoints; the other ranks take what it read through these.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_dl.distribute import collective


def broadcast_ints(values: Sequence[int], root_rank: int = 0, prefix: str = "ints") -> list[int]:
    """Rank ``root_rank``'s ``values`` on every rank (collective; each rank passes as many)."""
    import tensorflow as tf

    var = tf.Variable([int(v) for v in values], dtype=tf.int64, trainable=False)
    collective.broadcast_variables([var], root_rank=root_rank, prefix=prefix)
    return [int(v) for v in var.numpy()]


def broadcast_record(
    values: Sequence[int], root_rank: int = 0, prefix: str = "record"
) -> list[int]:
    """Rank ``root_rank``'s ``values`` on every rank, whatever the other ranks pass (its
    length is broadcast first)."""
    (length,) = broadcast_ints([len(values)], root_rank, prefix=f"{prefix}_length")
    padded = list(values)[:length] + [0] * max(0, length - len(values))
    return broadcast_ints(padded, root_rank, prefix=prefix) if length else []
