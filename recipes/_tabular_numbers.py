"""The tabular recipe's numeric columns inside the model: missing values (NaN) and normalization.

A float column whose training rows hold NaN gets the column's training mean in their place and
a 0/1 "was missing" input beside it, so the network can tell a filled value from a real one (as
scikit-learn's ``SimpleImputer(add_indicator=True)``). Columns without NaN are only normalized,
as before.
"""

from __future__ import annotations

import numpy as np


def encode_numbers(x, flat: np.ndarray) -> list:
    """``x`` (float32, ``(rows, k)``) normalized by ``flat``'s training statistics, NaN filled
    with the mean, and a flag per column that had NaN; the tensors to concatenate."""
    import keras
    from keras import layers

    missing = np.isnan(flat).any(axis=0)
    if not missing.any():
        # Constant columns have zero variance; 1 keeps them finite (they carry no signal).
        var = np.where(flat.var(0) > 0, flat.var(0), 1.0)
        return [layers.Normalization(mean=flat.mean(0), variance=var)(x)]
    with np.errstate(all="ignore"):  # an all-NaN column: mean 0, variance 1
        mean = np.nan_to_num(np.nanmean(flat, 0))
        var = np.nan_to_num(np.nanvar(flat, 0))
    var = np.where(var > 0, var, 1.0)
    nan = keras.ops.isnan(x)
    filled = keras.ops.where(nan, keras.ops.convert_to_tensor(mean.astype("float32")), x)
    flags = keras.ops.cast(keras.ops.take(nan, np.flatnonzero(missing), axis=1), "float32")
    return [layers.Normalization(mean=mean, variance=var)(filled), flags]
