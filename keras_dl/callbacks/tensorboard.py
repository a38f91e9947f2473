"""RunTensorBoard: Keras' TensorBoard callback whose logs (and profiler trace) end up in the run.

Rank 0 only: add it to rank 0's callbacks (``keras_dl.train`` does, with
``tracking.tensorboard=true`` or ``runtime.profile_steps``); several ranks writing one log
folder would interleave their events.

The logs are written to a local folder (a temporary one by default, so a run folder on S3
works too) and uploaded at the end of training to the run's ``tensorboard_logs/`` artifacts,
where ``mlflow.tensorflow.autolog`` puts its own. With that autolog on there is still one
writer: autolog finds this callback (a ``keras.callbacks.TensorBoard``), adds none of its own,
and uploads this folder itself after ``fit``, so this callback then leaves the upload to it.

``profile_steps=(START, END)`` has TensorFlow's profiler trace training steps START to END of
the ``fit`` (counted from 1): the trace (``plugins/profile/*/*.xplane.pb``) goes up with the
logs and opens in TensorBoard's Profile tab (``pip install tensorboard-plugin-profile``), whose
input-pipeline analysis says whether the steps waited for input or computed.

Example:
    >>> tb = RunTensorBoard(run_id=run.info.run_id, profile_steps=(10, 15))   # doctest: +SKIP
    >>> model.fit(ds, epochs=3, callbacks=[tb])                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings

import keras

from keras_dl import tracking
from keras_dl.callbacks.mlflow_logger import autolog_logs_epochs

log = logging.getLogger(__name__)

ARTIFACT_PATH = "tensorboard_logs"  # where mlflow.tensorflow.autolog uploads its logs


class RunTensorBoard(keras.callbacks.TensorBoard):
    """Write TensorBoard logs (and a profiler trace) and upload them to an MLflow run.

    Args:
        run_id: The run that gets the logs. Defaults to the active run at the end of training.
        tracking_uri: Tracking URI. Defaults to MLflow's current URI.
        log_dir: Local folder of the logs. Defaults to a temporary folder, removed after the
            upload.
        profile_steps: ``(START, END)``: trace training steps START to END (from 1) with
            TensorFlow's profiler. Defaults to () (no trace).
        **kwargs: Other arguments of ``keras.callbacks.TensorBoard`` (``histogram_freq`` ...).
    """

    def __init__(
        self,
        run_id: str | None = None,
        tracking_uri: str | None = None,
        log_dir: str | None = None,
        profile_steps: tuple[int, ...] = (),
        **kwargs,
    ):
        self._temporary = log_dir is None
        log_dir = log_dir or tempfile.mkdtemp(prefix="keras_dl_tensorboard_")
        super().__init__(log_dir=log_dir, profile_batch=tuple(profile_steps) or 0, **kwargs)
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.uploaded = False

    def on_train_begin(self, logs=None):
        self.uploaded = False
        super().on_train_begin(logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)  # closes the writers and stops a profiler still tracing
        if _tensorflow_autolog_on():
            return  # autolog uploads this folder after fit, to the same artifact path
        self.upload()

    def upload(self) -> bool:
        """Upload the log folder to the run's ``tensorboard_logs/``; a failure warns.

        Returns:
            True when the logs are in the run.
        """
        run_id = self.run_id or tracking.active_run_id()
        if run_id is None:
            warnings.warn(
                f"RunTensorBoard: no MLflow run to upload {self.log_dir} to; the logs stay there.",
                stacklevel=2,
            )
            return False
        try:
            client = tracking.client(self.tracking_uri or tracking.tracking_uri())
            client.log_artifacts(run_id, self.log_dir, ARTIFACT_PATH)
        except Exception as exc:  # logging must not fail training
            warnings.warn(
                f"RunTensorBoard: could not upload {self.log_dir} to run {run_id} ({exc}); the "
                "logs stay there.",
                stacklevel=2,
            )
            return False
        self.uploaded = True
        if self._temporary:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return True


def _tensorflow_autolog_on() -> bool:
    """mlflow.tensorflow.autolog (not keras'): the one that adds and uploads TensorBoard logs."""
    if not autolog_logs_epochs():
        return False
    return tracking.autolog_on("tensorflow")
