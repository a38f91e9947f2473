"""The settings other engines need to reach the same store: deltalake's storage options, its
row-group options, the safe-commit check, and the environment Spark tasks inherit."""

from __future__ import annotations

import os

from keras_dl.errors import DataError
from keras_dl.storage import azure
from keras_dl.storage.filesystems import S3_SCHEMES, local_path, s3_endpoint, s3_region


def delta_storage_options(uri: str) -> dict[str, str]:
    """deltalake's ``storage_options`` for ``uri``, from the same environment (empty if local).

    deltalake 1.x commits to S3 with conditional PUTs and has no DynamoDB lock, so no lock
    setting is passed (see :func:`check_safe_delta_writes`). Azure tables (``abfs[s]://``) get
    the account, its credential and endpoint (:func:`keras_dl.storage.azure.delta_options`);
    their commits are conditional writes too.
    """
    if local_path(uri) is None and azure.is_azure(uri):
        return azure.delta_options(uri)
    if local_path(uri) is not None or uri.split("://", 1)[0] not in S3_SCHEMES:
        return {}
    env = os.environ
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    out = {k: env[k] for k in keys if env.get(k)}
    region = s3_region()
    if region:
        out["AWS_REGION"] = region
    endpoint = s3_endpoint()
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    return out


def delta_row_group_options(rows_per_group: int) -> dict:
    """``write_deltalake`` keyword arguments for row groups of ``rows_per_group`` rows.

    deltalake 1.x writes with delta-rs' own Parquet writer: the row-group size is a writer
    property, and files are cut by bytes (delta-rs' ``target_file_size``), not by rows.
    """
    import deltalake

    return {"writer_properties": deltalake.WriterProperties(max_row_group_size=rows_per_group)}


def check_safe_delta_writes(uri: str) -> None:
    """Refuse a Delta write to S3 that could lose commits to a concurrent writer.

    deltalake 1.x commits with a conditional PUT (``If-None-Match``: the commit file is created
    only if absent), which S3 enforces, so it needs no lock. It dropped the DynamoDB lock and only
    logs that it ignores ``AWS_S3_LOCKING_PROVIDER=dynamodb``: a user who set it expects writers
    (Spark's ``S3DynamoDBLogStore``) to coordinate through it, which they would not, so the write
    is refused, naming the variable.

    Raises:
        DataError: Naming the table and the variable to unset.
    """
    if local_path(uri) is not None or uri.split("://", 1)[0] not in S3_SCHEMES:
        return
    if os.environ.get("AWS_S3_LOCKING_PROVIDER", "").lower() == "dynamodb":
        raise DataError(
            f"Writing the Delta table {uri!r}: AWS_S3_LOCKING_PROVIDER=dynamodb is set, but "
            "deltalake 1.x dropped the DynamoDB lock (it would ignore the setting). Its S3 "
            "commits are conditional writes, safe without a lock: unset "
            "AWS_S3_LOCKING_PROVIDER and DELTA_DYNAMO_TABLE_NAME (Spark writers using "
            "S3DynamoDBLogStore do not coordinate with it)."
        )


_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


def environment() -> dict[str, str]:
    """The object-store settings of this process's environment, to hand to Spark tasks.

    Executors may not share the driver's environment (a cluster, or Python workers started
    before the variables were set); tasks call :func:`use_environment` with this. MLflow's S3
    artifact store reads its endpoint from ``MLFLOW_S3_ENDPOINT_URL``: when that is unset, it is
    ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, so one endpoint setting serves both.
    """
    keys = (*_ENV, *azure.ENV, "MLFLOW_S3_ENDPOINT_URL")
    out = {k: os.environ[k] for k in keys if os.environ.get(k)}
    endpoint = s3_endpoint()
    if endpoint and "MLFLOW_S3_ENDPOINT_URL" not in out:
        out["MLFLOW_S3_ENDPOINT_URL"] = endpoint
    return out


def use_environment(settings: dict[str, str]) -> None:
    """Apply the driver's object-store settings where this process has none of its own."""
    for key, value in settings.items():
        os.environ.setdefault(key, value)
