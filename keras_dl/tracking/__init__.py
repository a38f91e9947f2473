"""Tracking: the one home of MLflow in keras_dl (an import contract in ``.importlinter`` keeps
it so). The rest of keras_dl talks to this small interface, never to ``mlflow`` itself.

- :func:`client`: an ``MlflowClient`` for a tracking URI, and the entities (:func:`metric`,
  :func:`param`) its ``log_batch`` takes (:mod:`keras_dl.tracking.client`).
- :mod:`keras_dl.tracking.active`: this process's active run (its id, tags and params, the
  tracking URI, whether MLflow's autolog is on).
- :mod:`keras_dl.tracking.models`: logged and registered models (register a version, read
  a logged model's MLmodel, load it back).
- :mod:`keras_dl.tracking.datasets`: the splits a run read, as MLflow dataset inputs.
- :mod:`keras_dl.tracking.store`: pointing MLflow at the store, checking it answers, the tags
  keras_dl sets on runs, the ``mlflow ui`` hint.
- :mod:`keras_dl.tracking.mlflow_run`: the MLflow run (start, create, end, terminate).
- :mod:`keras_dl.tracking.rest`: the few calls MLflowLogger's sending thread makes without the
  client's long retries.
"""

from keras_dl.tracking.active import (
    activate,
    active_run_id,
    autolog_on,
    log_metrics,
    log_params,
    set_tag,
    set_tags,
    set_tracking_uri,
    tracking_uri,
)
from keras_dl.tracking.client import artifact_repository, client, is_mlflow_error, metric, param
from keras_dl.tracking.mlflow_run import create_run, end_run, start_run, terminate_run
from keras_dl.tracking.models import (
    download_artifacts,
    infer_signature,
    load_keras_model,
    load_pyfunc_model,
    logged_model,
    model_flavors,
    register_model,
)
from keras_dl.tracking.rest import is_reachable
from keras_dl.tracking.store import (
    FAILURE_REASON_TAG,
    FAILURE_TAG,
    GATE_TAG,
    NOT_REGISTERED_TAG,
    PREEMPTED_TAG,
    check_reachable,
    describe_version,
    failure_tags,
    failure_text,
    git_tags,
    setup_mlflow,
    ui_command,
)

__all__ = [
    "FAILURE_REASON_TAG",
    "FAILURE_TAG",
    "GATE_TAG",
    "NOT_REGISTERED_TAG",
    "PREEMPTED_TAG",
    "activate",
    "active_run_id",
    "artifact_repository",
    "autolog_on",
    "check_reachable",
    "client",
    "create_run",
    "describe_version",
    "download_artifacts",
    "end_run",
    "failure_tags",
    "failure_text",
    "git_tags",
    "infer_signature",
    "is_mlflow_error",
    "is_reachable",
    "load_keras_model",
    "load_pyfunc_model",
    "log_metrics",
    "log_params",
    "logged_model",
    "metric",
    "model_flavors",
    "param",
    "register_model",
    "set_tag",
    "set_tags",
    "set_tracking_uri",
    "setup_mlflow",
    "start_run",
    "terminate_run",
    "tracking_uri",
    "ui_command",
]
