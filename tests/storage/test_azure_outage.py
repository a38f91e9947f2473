"""Azure outages: Azurite paused (SIGSTOP) and resumed (SIGCONT), and which Azure errors are
transient. The test that pauses starts its own Azurite, so no other test waits on it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from keras_dl.runlock import AzureLease
from keras_dl.storage import open_store
from keras_dl.storage.retry import is_transient
from tests.azurite import AzureContainer, AzuriteServer, point_azure_at
from tests.conftest import HEAVY_IO


def test_azure_timeouts_refusals_and_5xx_are_transient_and_denials_are_not():
    from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

    refused = OSError(
        "GetProperties for 'http://127.0.0.1:9/devstoreaccount1/lake' failed. Azure Error: [] "
        "Fail to get a new connection for: http://127.0.0.1:9. Could not connect to server"
    )
    busy = OSError("GetProperties for 'x' failed. Azure Error: [ServerBusy] 503 Busy.")
    denied = OSError(
        "GetProperties for 'x' failed. Azure Error: [AuthorizationFailure] 403 Server failed to "
        "authenticate the request."
    )
    reset = OSError(
        "GetProperties failed for 'http://127.0.0.1:9/devstoreaccount1/lake/t/a.parquet'. Azure "
        "Error: [] Error while reading from network socket. CURLE code: 56. Failure when "
        "receiving data from the peer"
    )
    assert is_transient(refused) and is_transient(busy) and not is_transient(denied)
    assert is_transient(reset)
    assert is_transient(ServiceRequestError("connection refused"))
    assert is_transient(ServiceResponseError("read timed out"))
    unavailable, forbidden = HttpResponseError("unavailable"), HttpResponseError("forbidden")
    unavailable.status_code, forbidden.status_code = 503, 403
    assert is_transient(unavailable) and not is_transient(forbidden)


@pytest.mark.slow
@HEAVY_IO
def test_a_store_call_and_the_lease_ride_out_an_azure_outage_shorter_than_the_lease(
    monkeypatch,
):
    server = AzuriteServer().ensure()
    try:
        point_azure_at(server, monkeypatch)
        container = AzureContainer(server, "lake")
        container.client().create_container()
        lease = AzureLease(container.uri("run"), lease_seconds=30)
        lease.acquire()
        folder = open_store(container.uri("run"))
        try:
            os.kill(server.proc.pid, signal.SIGSTOP)
            resume = threading.Timer(12, os.kill, (server.proc.pid, signal.SIGCONT))
            resume.start()
            start = time.monotonic()
            # pyarrow's Azure client has no request timeout: it waits for the paused store.
            folder.write("run.json", b'{"run_id": "abc"}')
            assert time.monotonic() - start > 10
            resume.join()
            assert folder.read("run.json") == b'{"run_id": "abc"}'
            time.sleep(lease.lease_seconds / 3 + 2)  # a renewal after the outage
            assert lease.lost is None and lease.holder().pid == os.getpid()
            assert lease.holder().expires > time.time() + 15
        finally:
            lease.release()
        assert container.names() == ["run/run.json"]
    finally:
        with contextlib.suppress(Exception):
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
