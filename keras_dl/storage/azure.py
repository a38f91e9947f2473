"""Azure Blob storage and ADLS Gen2 (``abfs://``, ``abfss://``): URIs, settings and clients.

A URI names a container, the storage account and a path:
``abfss://container@account.dfs.core.windows.net/path`` (the form Spark and Databricks use), or
``abfss://container/path`` with the account from ``AZURE_STORAGE_ACCOUNT_NAME``. On the
``pyarrow.fs.AzureFileSystem`` of the account the same file is ``container/path``.

The account, its credential and its endpoint come from the standard variables, with no
keras_dl setting:

- ``AZURE_STORAGE_CONNECTION_STRING``, when set, says all three (``AccountName``,
  ``AccountKey`` or ``SharedAccessSignature``, and ``BlobEndpoint``; or
  ``UseDevelopmentStorage=true`` for the emulator on its default port);
- otherwise ``AZURE_STORAGE_ACCOUNT_NAME`` (when the URI does not name the account), and
  ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``. With neither, Azure's default
  credential chain is used (``AZURE_CLIENT_ID`` / ``AZURE_TENANT_ID`` / ``AZURE_CLIENT_SECRET``,
  a managed identity, the Azure CLI's login);
- ``AZURE_STORAGE_ENDPOINT``: the account's blob endpoint, for an emulator or a private
  endpoint (``http://127.0.0.1:10000/devstoreaccount1`` for Azurite; ``http://`` is allowed),
  or ``AZURE_STORAGE_USE_EMULATOR=true`` (then ``AZURITE_BLOB_STORAGE_URL``, default
  ``http://127.0.0.1:10000``), as deltalake reads them.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from keras_dl.errors import DataError
from keras_dl.extras import import_extra
from keras_dl.storage.retry import check_root

AZURE_SCHEMES = ("abfs", "abfss")
# Azurite's one account and its published key (not a secret: the emulator's documented default).
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
ENV = (
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURITE_BLOB_STORAGE_URL",
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_SECRET",
)


@dataclass(frozen=True)
class AzureAccount:
    """One storage account as the environment reaches it.

    Args:
        name: The account name.
        key: Its shared key, if one was given. Defaults to None.
        sas_token: A SAS token (without the leading ``?``), if one was given. Defaults to None.
        endpoint: The account's blob URL; None for ``https://NAME.blob.core.windows.net``.
            Defaults to None.
    """

    name: str
    key: str | None = None
    sas_token: str | None = None
    endpoint: str | None = None

    @property
    def blob_url(self) -> str:
        """The account's blob service URL."""
        return (self.endpoint or f"https://{self.name}.blob.core.windows.net").rstrip("/")


def is_azure(uri: str) -> bool:
    """True for an ``abfs://`` or ``abfss://`` URI."""
    return uri.split("://", 1)[0].lower() in AZURE_SCHEMES


def split_uri(uri: str) -> tuple[str, str | None, str]:
    """``(container, account or None, path)`` of ``abfs[s]://container[@account.host]/path``."""
    parts = urlsplit(uri)
    container, at, host = parts.netloc.partition("@")
    account = host.split(".", 1)[0] if at else None
    if not container:
        raise DataError(
            f"{uri!r} names no container: write abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/"
            "PATH (or abfss://CONTAINER/PATH with AZURE_STORAGE_ACCOUNT_NAME set)."
        )
    return container, account or None, parts.path.strip("/")


def fs_path(uri: str) -> str:
    """The path of ``uri`` on its account's filesystem: ``container/path``."""
    container, _, path = split_uri(uri)
    return f"{container}/{path}".rstrip("/")


def uri_on(like: str, path: str) -> str:
    """The URI of ``path`` (``container/...`` on the filesystem of ``like``), in ``like``'s form."""
    scheme = like.split("://", 1)[0]
    _, at, host = urlsplit(like).netloc.partition("@")
    container, _, rest = path.lstrip("/").partition("/")
    where = f"{container}@{host}" if at else container
    return f"{scheme}://{where}/{rest}".rstrip("/")


def account_of(uri: str) -> AzureAccount:
    """The account of ``uri`` and how to reach it, from the environment (see the module).

    Raises:
        DataError: Naming the variable to set when no account name is known, or when the
            connection string is for another account than the URI names.
    """
    named = split_uri(uri)[1]
    env = os.environ
    conn = _parse_connection_string(env.get("AZURE_STORAGE_CONNECTION_STRING", ""))
    if conn:
        name = conn.get("AccountName") or named
        if named and name and named != name:
            raise DataError(
                f"{uri!r} is in the storage account {named!r}, but "
                f"AZURE_STORAGE_CONNECTION_STRING is for {name!r}: use that account's "
                "connection string, or unset it and set AZURE_STORAGE_ACCOUNT_NAME and "
                "AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN)."
            )
        if name:
            return AzureAccount(
                name=name,
                key=conn.get("AccountKey"),
                sas_token=(conn.get("SharedAccessSignature") or "").lstrip("?") or None,
                endpoint=conn.get("BlobEndpoint") or _suffixed(conn, name) or _endpoint(name),
            )
    name = named or env.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not name:
        raise DataError(
            f"{uri!r} names no storage account and AZURE_STORAGE_ACCOUNT_NAME is not set: write "
            "abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH, or set "
            "AZURE_STORAGE_ACCOUNT_NAME (or AZURE_STORAGE_CONNECTION_STRING)."
        )
    key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or None
    sas = (env.get("AZURE_STORAGE_SAS_TOKEN") or "").lstrip("?") or None
    return AzureAccount(
        name=name, key=key, sas_token=None if key else sas, endpoint=_endpoint(name)
    )


def credentials_said(account: AzureAccount) -> str:
    """How a message says which credential is in use, naming the variables."""
    if account.key:
        return "an account key (AZURE_STORAGE_ACCOUNT_KEY or the connection string's AccountKey)"
    if account.sas_token:
        return (
            "a SAS token (AZURE_STORAGE_SAS_TOKEN or the connection string's SharedAccessSignature)"
        )
    return (
        "Azure's default credential, since none of AZURE_STORAGE_CONNECTION_STRING, "
        "AZURE_STORAGE_ACCOUNT_KEY and AZURE_STORAGE_SAS_TOKEN is set"
    )


def azure_filesystem(account: AzureAccount):
    """A ``pyarrow.fs.AzureFileSystem`` on ``account`` (its credential and endpoint), one per
    account and identity variables, shared as ``filesystems._s3_filesystem`` says why."""
    identity = tuple(os.environ.get(k) for k in _IDENTITY_VARIABLES)
    return _azure_filesystem(account, identity)


# What Azure's default credential reads from the environment (no key or SAS token given).
_IDENTITY_VARIABLES = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET")


@functools.lru_cache(maxsize=16)
def _azure_filesystem(account: AzureAccount, identity: tuple):
    import pyarrow.fs as pafs

    kwargs: dict = {"account_name": account.name}
    if account.key:
        kwargs["account_key"] = account.key
    elif account.sas_token:
        # pyarrow 25 appends the token to the account's URL as given: without its "?" it
        # becomes part of the path.
        kwargs["sas_token"] = "?" + account.sas_token
    if account.endpoint:
        parts = urlsplit(account.endpoint)
        host = parts.netloc
        # pyarrow puts the account in the path for an authority like "127.0.0.1:10000" (how
        # Azurite serves it), and in the host name for one that starts with ".".
        authority = host[len(account.name) :] if host.startswith(account.name + ".") else host
        dfs = authority.replace(".blob.", ".dfs.", 1) if authority.startswith(".") else authority
        kwargs.update(
            blob_storage_authority=authority,
            dfs_storage_authority=dfs,
            blob_storage_scheme=parts.scheme or "https",
            dfs_storage_scheme=parts.scheme or "https",
        )
    return pafs.AzureFileSystem(**kwargs)


def delta_options(uri: str) -> dict[str, str]:
    """deltalake's ``storage_options`` for an ``abfs[s]://`` table, from the same environment."""
    account = account_of(uri)
    out = {"AZURE_STORAGE_ACCOUNT_NAME": account.name}
    if account.key:
        out["AZURE_STORAGE_ACCOUNT_KEY"] = account.key
    elif account.sas_token:
        out["AZURE_STORAGE_SAS_TOKEN"] = account.sas_token
    for key in _IDENTITY_VARIABLES:
        if os.environ.get(key) and not (account.key or account.sas_token):
            out[key] = os.environ[key]
    if account.endpoint:
        out["AZURE_STORAGE_ENDPOINT"] = account.endpoint
        if account.endpoint.startswith("http://"):
            out["AZURE_ALLOW_HTTP"] = "true"
    return out


def check_container(fs, uri: str) -> None:
    """Fail early, naming the container, the account and the variables, when the container of
    ``uri`` cannot be reached (the Azure twin of :func:`~keras_dl.storage.check_bucket`).

    A container that answered once in this process is in an outage when it stops answering: the
    check is then retried (:mod:`keras_dl.storage.retry`). One never reached fails at once.

    Raises:
        StoreUnavailable: A container that answered before did not answer again in time.
        DataError: For a missing container, refused credentials or an unreachable endpoint.
    """
    import pyarrow.fs as pafs

    container = split_uri(uri)[0]
    account = account_of(uri)
    where = f"in the storage account {account.name!r} at {account.blob_url}"

    check_root(
        lambda: fs.get_file_info(container).type != pafs.FileType.NotFound,
        uri,
        (account.blob_url, container),
        lambda exc: (
            f"Container {container!r} of {uri!r} cannot be reached {where} ({exc}). It was "
            f"asked with {credentials_said(account)}; check AZURE_STORAGE_ENDPOINT (or the "
            "connection string's BlobEndpoint) and the credential."
        ),
        f"Container {container!r} of {uri!r} does not exist {where}, or "
        f"{credentials_said(account)} cannot see it. Create the container, or fix the URI "
        "or the credentials.",
    )


def blob_service(account: AzureAccount, **client_options):
    """An ``azure.storage.blob.BlobServiceClient`` on ``account``.

    Raises:
        MissingExtra: Naming the extra to install when azure-storage-blob is missing.
    """
    blob = import_extra(
        "azure.storage.blob", "An abfs:// run directory (its lease is a blob lease)"
    )
    BlobServiceClient = blob.BlobServiceClient  # noqa: N806 - the class, as Azure names it
    credential = None
    if account.key:
        credential = {"account_name": account.name, "account_key": account.key}
    elif account.sas_token:
        credential = account.sas_token
    else:  # a service principal, a managed identity, the CLI's login
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            raise ImportError(
                f"No key or SAS token for the storage account {account.name!r}: set "
                "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or "
                "AZURE_STORAGE_CONNECTION_STRING, or pip install azure-identity to use Azure's "
                "default credential."
            ) from None
        credential = DefaultAzureCredential()
    return BlobServiceClient(account.blob_url, credential=credential, **client_options)


def _endpoint(name: str) -> str | None:
    env = os.environ
    if env.get("AZURE_STORAGE_ENDPOINT"):
        return env["AZURE_STORAGE_ENDPOINT"].rstrip("/")
    if env.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true", "yes"):
        base = env.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
        return f"{base.rstrip('/')}/{name}"
    return None


def _suffixed(conn: dict[str, str], name: str) -> str | None:
    """The blob URL a connection string with an ``EndpointSuffix`` (another cloud) names."""
    suffix = conn.get("EndpointSuffix")
    scheme = conn.get("DefaultEndpointsProtocol") or "https"
    return f"{scheme}://{name}.blob.{suffix}" if suffix else None


def _parse_connection_string(text: str) -> dict[str, str]:
    """``Key=value;...`` as a dict (a value may hold "=", as keys and SAS tokens do)."""
    out = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
    if out.get("UseDevelopmentStorage", "").lower() == "true":
        base = os.environ.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
        out.setdefault("AccountName", EMULATOR_ACCOUNT)
        out.setdefault("AccountKey", EMULATOR_KEY)
        out.setdefault("BlobEndpoint", f"{base.rstrip('/')}/{EMULATOR_ACCOUNT}")
    return out
