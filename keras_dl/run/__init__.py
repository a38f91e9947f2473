"""One training run: :func:`open_run` gives the :class:`Run` that owns the run folder (through a
:class:`~keras_dl.storage.Store`), its lock or lease, and its MLflow run from start to end.

The entry points (``fit``, the Horovod launcher, the Spark estimator) open runs; the default
callbacks are built from the run (:func:`make_callbacks`).
"""

from keras_dl.run.callbacks import make_callbacks, prepare_fit
from keras_dl.run.folder import CONFIG_FILE, RUN_FILE, RunFolder
from keras_dl.run.resume import config_fingerprint, resume_run_id
from keras_dl.run.run import Run, open_run

__all__ = [
    "CONFIG_FILE",
    "RUN_FILE",
    "Run",
    "RunFolder",
    "config_fingerprint",
    "make_callbacks",
    "open_run",
    "prepare_fit",
    "resume_run_id",
]
