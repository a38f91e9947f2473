"""Let Petastorm 0.13.1 (its last release) read every numeric Parquet type.

Petastorm infers a Unischema from the Parquet schema and silently drops the columns whose Arrow
type it does not know: unsigned 16/32/64-bit integers, fixed-size lists and the "large" string,
binary and list variants, all of which Spark, pyarrow and delta-rs write. A dropped column
would surface as a missing key mid-read. :func:`patch_module` teaches Petastorm's type inference
those types; the values themselves convert fine. It only adds types Petastorm refused, so
Petastorm's behaviour on the types it knew is unchanged.
"""

from __future__ import annotations

import numpy as np


def patch_module(module) -> bool:
    """Extend Petastorm's Arrow -> numpy type inference in ``petastorm.unischema`` (idempotent)."""
    if module.__name__ != "petastorm.unischema":
        return False
    original = module._numpy_and_codec_from_arrow_type
    if getattr(original, "_keras_dl_patched", False):
        return False
    import pyarrow as pa

    def infer(field_type):
        t = pa.types
        if t.is_uint16(field_type):
            return np.uint16
        if t.is_uint32(field_type):
            return np.uint32
        if t.is_uint64(field_type):
            return np.uint64
        if t.is_large_string(field_type):
            return np.str_  # np.unicode_ before numpy 2 (same type)
        if t.is_large_binary(field_type):
            return np.bytes_  # np.string_ before numpy 2 (same type)
        if t.is_fixed_size_list(field_type) or t.is_large_list(field_type):
            return infer(field_type.value_type)
        return original(field_type)

    infer._keras_dl_patched = True
    # Unischema.from_arrow_schema looks the function up by its module-level name.
    module._numpy_and_codec_from_arrow_type = infer
    return True
