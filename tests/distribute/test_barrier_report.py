"""A barrier task's failed rank tells the others through Horovod's rendezvous server
(keras_dl.launch.barrier._put), and its report reaches the driver whether or not it could.

The server is Horovod's own RendezvousServer on loopback, whose handler refuses the first PUTs
with 503 (a busy or restarting server); the rank is a real child process of ``_run_child``.
"""

from __future__ import annotations

import collections
import os
import threading

import pytest

from keras_dl.distribute.failures import explain_failure
from keras_dl.distribute.loopback import LOOPBACK, bound_to
from keras_dl.errors import DistributedError
from keras_dl.launch import barrier
from tests.conftest import REPO

Row = collections.namedtuple("Row", "rank code stopped result output")


def fail_on_purpose():
    """The rank's main: raise (pickled by reference: the child imports this module)."""
    raise ValueError("rank 1 fails on purpose")


@pytest.fixture
def rendezvous():
    """``fn(refuse)`` -> ``((address, port), puts)``: Horovod's rendezvous server on loopback
    that answers the first ``refuse`` PUTs with 503; ``puts`` counts the PUTs it got."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousServer

    servers = []

    def start(refuse: int):
        puts = {"count": 0}
        lock = threading.Lock()

        class Refusing(RendezvousHandler):
            def do_PUT(self):
                with lock:
                    puts["count"] += 1
                    refused = puts["count"] <= refuse
                if refused:
                    self.rfile.read(int(self.headers.get("Content-Length", 0)))
                    self.send_status_code(503)
                    return
                super().do_PUT()

        server = RendezvousServer()
        with bound_to(LOOPBACK):
            port = server.start(handler_cls=Refusing)
        servers.append(server)
        return (LOOPBACK, port), puts

    yield start
    for server in servers:
        server.stop()


def test_a_refused_put_is_retried_until_the_other_ranks_can_see_it(rendezvous):
    address, puts = rendezvous(refuse=1)
    assert not barrier._someone_failed(address)
    assert barrier._put(address, "first", "1 1") is None
    assert puts["count"] == 2  # refused once, stored on the retry
    assert barrier._someone_failed(address)  # what the other ranks' tasks poll


def test_a_put_refused_every_time_ends_with_the_address_and_the_last_error(rendezvous):
    address, puts = rendezvous(refuse=1000)
    error = barrier._put(address, "first", "1 1")
    assert puts["count"] == barrier._PUT_ATTEMPTS
    url = f"http://{address[0]}:{address[1]}/keras_dl_failed/first"
    assert error.startswith(f"PUT {url} failed {barrier._PUT_ATTEMPTS} times"), error
    assert "503" in error
    assert not barrier._someone_failed(address)


def test_a_failed_rank_that_could_not_tell_the_others_still_reaches_the_driver(
    rendezvous, tmp_path
):
    import cloudpickle

    address, puts = rendezvous(refuse=1000)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}
    payload = cloudpickle.dumps((fail_on_purpose, {}))
    code, stopped, result, output = barrier._run_child(1, payload, env, address)
    assert (code, stopped, result) == (1, False, b"")
    assert puts["count"] == barrier._PUT_ATTEMPTS
    # The task's own output says that the other ranks were not told, naming the address.
    note = next(line for line in output.splitlines() if "could not tell the other ranks" in line)
    assert note.startswith("[1]<stderr>:keras_dl: rank 1 (exit status 1)"), note
    assert f"http://{address[0]}:{address[1]}/keras_dl_failed/first" in note and "503" in note

    # The driver explains the job's failure from the tasks' rows: rank 1's report, not rank 0,
    # which its task stopped (as when a later poll had seen the failure).
    rows = [Row(0, -9, True, b"", ""), Row(1, code, stopped, result, output)]
    logs = tmp_path / "logs"
    logs.mkdir()
    with pytest.raises(RuntimeError, match=r"Process name: 1 Exit code: 1") as raised:
        barrier._check_rows(rows, str(logs), printed=True)
    explained = explain_failure(raised.value, str(logs), size=2)
    assert isinstance(explained, DistributedError)
    assert str(explained).startswith(
        "Horovod rank 1 failed: ValueError: rank 1 fails on purpose"
    ), explained
