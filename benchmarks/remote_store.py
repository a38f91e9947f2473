"""An object store for the benchmarks on this machine: an emulator on loopback, behind a latency proxy.

:func:`s3_behind_proxy` starts moto's standalone S3 server, :func:`azure_behind_proxy` Azurite's
Blob service (Azure Storage's emulator, which ``scripts/setup_azurite.sh`` installs with npm), each
on a free 127.0.0.1 port with a :class:`~benchmarks.latency_proxy.LatencyProxy` in front of it.
They point the standard AWS or Azure environment at the proxy (so keras_dl, pyarrow and
deltalake all go through it) and create a bucket or container. Everything is stopped, and the
environment put back, when the block ends. :func:`azurite_command` is also how the tests start
Azurite (``tests/azurite.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.latency_proxy import LatencyProxy

BUCKET = "bench"
AZURITE_VERSION = "3.37.0"  # scripts/setup_azurite.sh's
AZURITE_ACCOUNT = "devstoreaccount1"  # Azurite's one account


@dataclass
class RemoteStore:
    """The proxy in front of the store, and where its tables go (``root``: a URI prefix)."""

    proxy: LatencyProxy
    root: str

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"


@contextlib.contextmanager
def s3_behind_proxy(delay_ms: float = 0.0) -> Iterator[RemoteStore]:
    """moto's S3 behind a latency proxy, the AWS environment pointed at the proxy."""
    import boto3  # moto's own dependency

    with contextlib.ExitStack() as stack:
        port = stack.enter_context(_moto_server())
        proxy = stack.enter_context(LatencyProxy(port, delay_ms))
        stack.enter_context(_aws_environment(proxy.url))
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield RemoteStore(proxy, f"s3://{BUCKET}")


@contextlib.contextmanager
def azure_behind_proxy(delay_ms: float = 0.0) -> Iterator[RemoteStore]:
    """Azurite's Blob service behind a latency proxy, the Azure environment pointed at the
    proxy (account name, key and endpoint), and a container."""
    from keras_dl.storage.azure import EMULATOR_KEY, ENV, account_of, azure_filesystem

    program = azurite_blob()  # before anything starts: the message says how to install it
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(_server(azurite_command(program), "Azurite"))
        proxy = stack.enter_context(LatencyProxy(port, delay_ms))
        values = {
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": EMULATOR_KEY,
            "AZURE_STORAGE_ENDPOINT": f"{proxy.url}/{AZURITE_ACCOUNT}",
        }
        # The other standard Azure variables, and MLflow's, are unset for the block.
        cleared = tuple(k for k in (*ENV, "AZURE_STORAGE_ACCESS_KEY") if k not in values)
        stack.enter_context(_environment(values, cleared))
        root = f"abfss://{BUCKET}@{AZURITE_ACCOUNT}.dfs.core.windows.net"
        azure_filesystem(account_of(root)).create_dir(BUCKET)  # the container
        yield RemoteStore(proxy, root)


def azurite_blob() -> str:
    """The ``azurite-blob`` program ``scripts/setup_azurite.sh`` installed (or one on the PATH).

    Raises:
        RuntimeError: Saying how to install it, when it is in neither place.
    """
    home = os.environ.get("KERAS_DL_AZURITE_HOME") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "keras-dl"
        / f"azurite-{AZURITE_VERSION}"
    )
    program = Path(home) / "node_modules" / ".bin" / "azurite-blob"
    if program.exists():
        return str(program)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise RuntimeError(
        f"Azurite is not installed ({program} is missing): run 'bash scripts/setup_azurite.sh' "
        "(make setup does; it needs Node.js 20+ and npm)."
    )


def azurite_command(program: str) -> Callable[[int], list[str]]:
    """The command that runs Azurite's Blob service in memory on ``127.0.0.1:PORT``."""

    # --loose: accept headers Azurite does not know; --skipApiVersionCheck: accept the newer
    # API versions pyarrow's and Python's Azure SDKs send. --blobKeepAliveTimeout: Node closes
    # a connection idle for 5 s by default, and pyarrow's Azure client takes 7-15 s of retries
    # to replace a pooled connection closed under it; Azure keeps idle connections for minutes.
    # --disableTelemetry: Azurite reports usage by default.
    def command(port: int) -> list[str]:
        return [
            program,
            *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
            *("--blobKeepAliveTimeout", "600", "--inMemoryPersistence"),
            *("--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry"),
        ]

    return command


def _moto_server():
    return _server(
        lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        "moto's server",
    )


@contextlib.contextmanager
def _server(command: Callable[[int], list[str]], name: str) -> Iterator[int]:
    """``command(port)`` run on a free loopback port; its port once it accepts connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _accepts(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited at start (code {proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start within 60 s")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _aws_environment(endpoint: str):
    values = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
    }
    return _environment(values, ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_S3_LOCKING_PROVIDER"))


@contextlib.contextmanager
def _environment(values: dict[str, str], cleared: tuple[str, ...]) -> Iterator[None]:
    """``values`` set and ``cleared`` unset in ``os.environ`` for the block, then put back."""
    saved = {k: os.environ.get(k) for k in (*values, *cleared)}
    os.environ.update(values)
    for key in cleared:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
