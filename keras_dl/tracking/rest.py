"""The few MLflow calls MLflowLogger's sending thread (and a rank's quick check) makes, without the client's long retries.

MLflow's HTTP client retries a refused connection with exponential backoff for minutes. The
logger has its own retry loop, so against a tracking server it checks ``/health`` first and
sends ``log-batch`` once; other stores (SQLite, files) go through ``MlflowClient``.
"""

from __future__ import annotations


def is_http(uri: str) -> bool:
    """True for a tracking server URI (http or https)."""
    return uri.startswith(("http://", "https://"))


def is_reachable(uri: str, timeout: float = 2.0) -> tuple[bool, str]:
    """Whether the store at ``uri`` answers (``/health`` for a server; other stores: True).

    Returns:
        ``(answers, reason)``: the reason is empty when it answers.
    """
    if not is_http(uri):
        return True, ""
    import requests

    try:
        if requests.get(uri.rstrip("/") + "/health", timeout=timeout).ok:
            return True, ""
        return False, "the /health check failed"
    except requests.RequestException as exc:
        return False, str(exc)


def send_batch(client, uri: str, run_id: str, metrics: list, params: list) -> None:
    """Log ``metrics`` and ``params`` (MLflow entities) to ``run_id`` in one call, no retries.

    Raises:
        MlflowException: When the store refuses the batch or cannot be reached.
    """
    if not is_http(uri):
        client.log_batch(run_id, metrics=metrics, params=params)
        return
    import json

    from mlflow.protos.service_pb2 import LogBatch
    from mlflow.tracking._tracking_service.utils import get_default_host_creds
    from mlflow.utils.proto_json_utils import message_to_json
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    endpoint = "/api/2.0/mlflow/runs/log-batch"
    body = message_to_json(
        LogBatch(
            run_id=run_id,
            metrics=[m.to_proto() for m in metrics],
            params=[p.to_proto() for p in params],
        )
    )
    response = http_request(
        get_default_host_creds(uri),
        endpoint,
        "POST",
        max_retries=0,
        backoff_factor=0,
        timeout=10,
        json=json.loads(body),
    )
    verify_rest_response(response, endpoint)


def is_rejection(exc: Exception) -> bool:
    """True for an answer of the store that retrying cannot change (HTTP 4xx-like errors)."""
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException):
        return False
    return 400 <= exc.get_http_status_code() < 500 and exc.error_code != "TEMPORARILY_UNAVAILABLE"
