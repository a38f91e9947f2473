"""One checkpoint's payload: a local ``.npz`` file with a model's whole training state.

It holds every model variable (dropout seed states included), every optimizer variable (its
step counter included), the NumPy and Python RNG states, and a JSON header (the epoch, step,
run id, config fingerprint, ...). Where the file goes, and what makes it count, is
:mod:`keras_dl.checkpoints.protocol`'s business: this module only writes and reads local files.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np

FORMAT = 2  # in every header written; absent from checkpoints written before manifests


def write_state(path: str | os.PathLike, model, header: dict) -> None:
    """Write ``model``'s variables, its optimizer's, the RNG states and ``header`` to ``path``."""
    arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
    if model.optimizer is not None:
        for i, v in enumerate(model.optimizer.variables):
            arrays[f"optimizer/{i}"] = np.asarray(v.numpy())
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    arrays["rng/numpy_keys"] = keys
    header = {
        **header,
        "format": FORMAT,
        "numpy_rng": [name, int(pos), int(has_gauss), float(gauss)],
    }
    version, internal, gauss_next = random.getstate()
    arrays["rng/python"] = np.asarray(internal, dtype=np.int64)
    header["python_rng"] = [version, gauss_next]
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def read_state(path: str | os.PathLike) -> tuple[dict, dict]:
    """``(header, arrays)`` of a checkpoint file, every member read and CRC-checked.

    Raises:
        OSError, ValueError, zipfile.BadZipFile, KeyError: The file is partial or corrupt.
    """
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(arrays.pop("header").tobytes().decode())
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not a JSON object.")
    return header, arrays


def restore_state(path: str | os.PathLike, model, label: str | None = None) -> dict:
    """Restore a file written by :func:`write_state` into ``model``; return its header.

    Every shape is checked before any variable is assigned: a mismatch leaves the model as it
    was.

    Raises:
        ValueError: The file's variables do not match the model's (another architecture or
            optimizer).
        OSError, zipfile.BadZipFile: The file is partial or corrupt.
    """
    label = label or str(path)
    header, arrays = read_state(path)
    model_vars = list(model.variables)
    saved_model = [k for k in arrays if k.startswith("model/")]
    if len(saved_model) != len(model_vars):
        raise ValueError(
            f"{label} holds {len(saved_model)} model variables but the model has {len(model_vars)}."
        )
    optimizer = model.optimizer
    saved_opt = [k for k in arrays if k.startswith("optimizer/")]
    if saved_opt and optimizer is not None and not optimizer.built:
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None:
            with strategy.scope():
                optimizer.build(model.trainable_variables)
        else:
            optimizer.build(model.trainable_variables)
    targets = [(f"model/{i}", v) for i, v in enumerate(model_vars)]
    if optimizer is not None:
        opt_vars = list(optimizer.variables)
        if len(saved_opt) != len(opt_vars):
            raise ValueError(
                f"{label} holds {len(saved_opt)} optimizer variables but the optimizer has "
                f"{len(opt_vars)}: was it written with another optimizer?"
            )
        targets += [(f"optimizer/{i}", v) for i, v in enumerate(opt_vars)]
    for key, var in targets:  # check every shape before assigning any
        if tuple(arrays[key].shape) != tuple(var.shape):
            raise ValueError(f"{label}: {key} has shape {arrays[key].shape}, expected {var.shape}.")
    for key, var in targets:
        var.assign(arrays[key])
    name, pos, has_gauss, gauss = header["numpy_rng"]
    np.random.set_state((name, arrays["rng/numpy_keys"], pos, has_gauss, gauss))
    version, gauss_next = header["python_rng"]
    random.setstate((version, tuple(int(i) for i in arrays["rng/python"]), gauss_next))
    return header
