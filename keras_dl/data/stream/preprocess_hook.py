"""A deterministic preprocess hook run in the generator, so the memory cache keeps its output.

When a split's hook says it is deterministic (its attribute ``deterministic``: decoding images
without augmentation), its outputs have a fixed shape per row, and this shard's outputs fit
``data.cache_max_bytes``, the hook runs once per row in the generator, and later epochs replay
its output (decoded images, not their bytes) from :class:`~keras_dl.data.stream.memory_cache.EpochCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from keras_dl.data.stream.blocks import WEIGHT, num_rows, slice_rows
from keras_dl.data.stream.features import ColumnPlan
from keras_dl.data.stream.signature import to_structure


class CachedHook:
    """``apply`` runs the hook (traced once) on each chunk, ``rows`` rows per call, and returns
    ``{position: array}`` of its flattened outputs; ``pack`` rebuilds the hook's output
    structure from such a dict (with the sample weights last, when there are any)."""

    def __init__(self, concrete, out_spec):
        import tensorflow as tf

        self.concrete = concrete
        self.out_spec = out_spec
        flat = tf.nest.flatten(out_spec)
        self.keys = [str(i) for i in range(len(flat))]
        self.blocked_spec = tf.nest.pack_sequence_as(
            out_spec, [tf.TensorSpec((None, *s.shape), s.dtype) for s in flat]
        )

    def apply(self, chunks: Iterator[tuple], plan: ColumnPlan, rows: int) -> Iterator[tuple]:
        """``(piece, arrays)`` chunks to ``(piece, hook outputs)``, row for row."""
        import tensorflow as tf

        for piece, arrays in chunks:
            n = num_rows(arrays)
            parts = []
            for lo in range(0, n, rows):
                rows_in = {k: v for k, v in arrays.items() if k != WEIGHT}
                args = to_structure(slice_rows(rows_in, lo, min(lo + rows, n), n), plan)
                out = self.concrete(*args) if isinstance(args, tuple) else self.concrete(args)
                parts.append([t.numpy() for t in tf.nest.flatten(out)])
            if parts:
                out = {
                    k: parts[0][i] if len(parts) == 1 else np.concatenate([p[i] for p in parts])
                    for i, k in enumerate(self.keys)
                }
                if WEIGHT in arrays:  # the rows' own sample weights ride past the hook
                    out[WEIGHT] = arrays[WEIGHT]
                yield piece, out

    def pack(self, values: dict):
        import tensorflow as tf

        out = tf.nest.pack_sequence_as(self.out_spec, [values[k] for k in self.keys])
        if WEIGHT in values:
            return (*out, values[WEIGHT]) if isinstance(out, tuple) else (out, values[WEIGHT])
        return out

    def signature(self, weighted: bool):
        import tensorflow as tf

        if not weighted:
            return self.blocked_spec
        weight = tf.TensorSpec((None, None), tf.float32)
        spec = self.blocked_spec
        return (*spec, weight) if isinstance(spec, tuple) else (spec, weight)


def cacheable_hook(
    preprocess: Callable | None, signature, rows: int, max_bytes: int
) -> CachedHook | None:
    """A :class:`CachedHook` when ``preprocess`` is deterministic, its outputs have fixed shapes
    per row, and ``rows`` rows of them fit ``max_bytes``; otherwise None (it runs in tf.data,
    every epoch)."""
    if preprocess is None or max_bytes <= 0:
        return None
    if not getattr(preprocess, "deterministic", False):
        return None
    import tensorflow as tf

    fn = tf.function(lambda *args: preprocess(*args))
    args = signature if isinstance(signature, tuple) else (signature,)
    concrete = fn.get_concrete_function(*args)
    outputs = tf.nest.flatten(concrete.structured_outputs)
    per_row = 0
    for t in outputs:
        if t.dtype == tf.string or not t.shape[1:].is_fully_defined():
            return None
        per_row += int(np.prod(t.shape[1:], dtype=np.int64)) * t.dtype.size
    if rows * per_row > max_bytes:
        return None
    out_spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec((None, *t.shape[1:]), t.dtype), concrete.structured_outputs
    )
    return CachedHook(concrete, out_spec)
