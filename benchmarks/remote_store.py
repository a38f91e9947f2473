"""An S3 store for the benchmarks on this machine: moto's server on loopback, behind a latency proxy.

:func:`s3_behind_proxy` starts moto's standalone S3 server on a free 127.0.0.1 port, a
:class:`~benchmarks.latency_proxy.LatencyProxy` in front of it, points the standard AWS
environment at the proxy (so keras_dl, pyarrow and deltalake all go through it) and creates a
bucket. Everything is stopped, and the environment put back, when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from benchmarks.latency_proxy import LatencyProxy

BUCKET = "bench"


@dataclass
class RemoteStore:
    """The proxy in front of the store, and the bucket's URI."""

    proxy: LatencyProxy
    bucket: str

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"


@contextlib.contextmanager
def s3_behind_proxy(delay_ms: float = 0.0) -> Iterator[RemoteStore]:
    """moto's S3 behind a latency proxy, the AWS environment pointed at the proxy."""
    import boto3  # moto's own dependency

    with contextlib.ExitStack() as stack:
        port = stack.enter_context(_moto_server())
        proxy = stack.enter_context(LatencyProxy(port, delay_ms))
        stack.enter_context(_aws_environment(proxy.url))
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield RemoteStore(proxy, BUCKET)


@contextlib.contextmanager
def _moto_server() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _accepts(port):
            if proc.poll() is not None:
                raise RuntimeError(f"moto's server exited at start (code {proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError("moto's server did not start within 60 s")
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


@contextlib.contextmanager
def _aws_environment(endpoint: str) -> Iterator[None]:
    values = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
    }
    cleared = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_S3_LOCKING_PROVIDER")
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
