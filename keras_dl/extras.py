"""The optional parts of keras-dl and the pip extras that bring them.

A core install (``pip install "keras-dl[cpu]"``) trains a recipe on a local table and logs it to
MLflow; Spark, Optuna, Prometheus, Azure, boto3 and OpenCV come with extras (setup.cfg
``extras_require``; tests/test_extras.py checks the two agree). Code that needs one imports it
through :func:`import_extra` inside the function that needs it, so the error names the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from keras_dl.errors import KerasDLError

# The top-level module -> (the extra that installs it, the package's name as a user knows it).
EXTRAS = {
    "pyspark": ("spark", "PySpark"),
    "optuna": ("tune", "Optuna"),
    "prometheus_client": ("monitoring", "prometheus-client"),
    "azure": ("azure", "azure-storage-blob"),
    "boto3": ("s3", "boto3"),
    "cv2": ("images", "OpenCV (opencv-python-headless)"),
    "ray": ("bench", "Ray Data"),
}


class MissingExtra(KerasDLError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def import_extra(module: str, needed_by: str) -> ModuleType:
    """Import ``module`` (e.g. ``"optuna"``, ``"azure.storage.blob"``), or raise naming its extra.

    Args:
        module: The module to import; its top-level name must be in :data:`EXTRAS`.
        needed_by: What needs it, as the user asked for it: ``"keras-dl tune"``,
            ``"tracking.prometheus_port"``.

    Raises:
        MissingExtra: The module (or a package it imports) is not installed, e.g.
            "keras-dl tune needs Optuna: pip install 'keras-dl[tune]'".
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(missing_extra_message(module, needed_by, exc)) from exc


def missing_extra_message(module: str, needed_by: str, exc: ImportError | None = None) -> str:
    """The sentence :func:`import_extra` raises: what needs which package, and the pip line."""
    extra, package = EXTRAS[module.split(".")[0]]
    cause = f" (`import {module}` failed: {exc})" if exc is not None else ""
    return (
        f"{needed_by} needs {package}, which is not installed{cause}: pip install "
        f"'keras-dl[{extra}]' (from a source checkout: pip install '.[{extra}]')."
    )
