"""Azurite, Azure Storage's emulator, for the Azure tests: its Blob API on a free loopback port.

``scripts/setup_azurite.sh`` (``make setup``) installs it with npm. Azurite emulates the Blob
endpoint of a storage account *without* a hierarchical namespace; there is no ADLS Gen2 (dfs)
endpoint, so the tests cover flat-namespace accounts only.
"""

from __future__ import annotations

import uuid

import pytest

from benchmarks import remote_store
from keras_dl.storage.azure import EMULATOR_KEY, ENV
from tests.servers import LoopbackServer

ACCOUNT = remote_store.AZURITE_ACCOUNT
KEY = EMULATOR_KEY  # Azurite's well-known account key
# What the product reads (ENV), and MLflow's own variable for wasbs:// artifacts.
_AZURE_ENV = (*ENV, "AZURE_STORAGE_ACCESS_KEY")


def azurite_blob() -> str:
    """The ``azurite-blob`` program setup installed (or one on the PATH)."""
    try:
        return remote_store.azurite_blob()
    except RuntimeError as exc:
        pytest.fail(str(exc))


class AzuriteServer(LoopbackServer):
    """Azurite's Blob service on a free loopback port, in memory; restarted if it died."""

    name = "Azurite"
    stop_grace = 1.0  # its data is in memory, nothing to save: no need to wait out its close

    def command(self, port: int) -> list[str]:
        return remote_store.azurite_command(azurite_blob())(port)  # the benchmark's, too

    @property
    def endpoint(self) -> str:
        """The account's blob URL (path-style, as Azurite serves it)."""
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    def ensure(self) -> AzuriteServer:
        """Itself, up (started, or started again on a new port if it died)."""
        self.start_if_down()
        return self


class AzureContainer:
    """A fresh container on the test server; ``uri(path)`` names a blob (or folder) in it."""

    def __init__(self, server: AzuriteServer, name: str):
        self.server, self.name = server, name

    def uri(self, path: str = "", scheme: str = "abfss") -> str:
        return f"{scheme}://{self.name}@{ACCOUNT}.dfs.core.windows.net/{path}".rstrip("/")

    def client(self):
        """An ``azure.storage.blob.ContainerClient`` on the container."""
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(self.server.connection_string())
        return service.get_container_client(self.name)

    def names(self) -> list[str]:
        """The container's blobs, less the empty ``folder/`` markers pyarrow leaves when it
        deletes a folder's last file (a flat namespace has no folders)."""
        return sorted(b.name for b in self.client().list_blobs() if not b.name.endswith("/"))


def point_azure_at(server: AzuriteServer, monkeypatch, how: str = "key") -> None:
    """The standard Azure environment pointed at Azurite: by account name, key and endpoint
    (``how="key"``), or by connection string (``"connection_string"``)."""
    for key in _AZURE_ENV:
        monkeypatch.delenv(key, raising=False)
    if how == "connection_string":
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string())
    else:
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT)
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
        monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", server.endpoint)


@pytest.fixture(scope="session")
def azurite_server():
    """Azurite of this pytest process (each xdist worker starts its own)."""
    server = AzuriteServer().ensure()
    yield server
    server.stop()


@pytest.fixture
def azure(azurite_server, monkeypatch) -> AzureContainer:
    """The standard Azure environment pointed at Azurite, and a new empty container."""
    server = azurite_server.ensure()
    point_azure_at(server, monkeypatch)
    container = AzureContainer(server, f"lake-{uuid.uuid4().hex[:10]}")
    container.client().create_container()
    return container
