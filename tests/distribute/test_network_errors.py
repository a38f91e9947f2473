"""A rank that cannot reach a peer names both addresses, the interface and the fix.

Gloo's words are real: captured from, and reproduced by, two Horovod ranks in two network
namespaces joined by a veth pair, each rank's Gloo interface ``lo`` (what a host whose own name
resolves to 127.0.0.1 gives an unpatched Horovod): each offers its peer 127.0.0.1, and the one
that connects is refused on its own host, then aborts (SIGABRT, exit 134)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import time

import pytest

from keras_dl.distribute.failures import explain_failure
from keras_dl.distribute.network_errors import (
    RankPlace,
    explain_unreachable_peer,
    gloo_failure,
    rank_places,
    report_rank_start,
)
from tests.conftest import HEAVY, REPO
from tests.distribute.test_death_evidence import GLOO_ABORT, _needs
from tests.distribute.test_failure_messages import HOROVOD
from tests.warm_python import REAL_PYTHON


def test_gloos_connect_failure_is_parsed_from_a_real_abort():
    failure = gloo_failure(GLOO_ABORT.splitlines())
    assert failure.address == "127.0.0.1" and failure.reason == "Connection refused"
    assert failure.line.endswith("pair.cc:799] connect [127.0.0.1]:63906: Connection refused")
    (place,) = rank_places(GLOO_ABORT.splitlines()).values()
    assert place == RankPlace(0, "vm", 17809, "lo", "127.0.0.1", "hosta")
    # Horovod's Spark launcher prefixes each line; a read error after a peer died is no cause.
    prefixed = ["[1]<stderr>:" + line for line in GLOO_ABORT.splitlines()]
    assert gloo_failure(prefixed).address == "127.0.0.1"
    assert gloo_failure(["[/g/pair.cc:589] Read error [10.0.0.2]:4: Connection reset"]) is None


def test_a_peer_on_loopback_is_the_hosts_name_and_the_unpatched_horovod(tmp_path):
    logs = tmp_path / "rank.0"
    logs.mkdir()
    (logs / "stderr").write_text(GLOO_ABORT)
    message = str(explain_failure(RuntimeError(HOROVOD.format(rank=0, code=134)), str(tmp_path)))
    assert message.startswith(
        "Horovod rank 0 on host vm could not connect to its peer at 127.0.0.1: Connection "
        "refused (Gloo: [/tmp/"
    ), message
    assert "It offers its peers 127.0.0.1 on interface lo (HOROVOD_GLOO_IFACE)." in message
    assert "its own host name on a loopback address (its /etc/hosts)" in message
    assert "scripts/build_horovod.sh" in message and "HOROVOD_GLOO_IFACE" in message


def test_a_peer_elsewhere_is_a_firewall_or_routing_between_the_two_addresses():
    # Gloo's format (pair.cc handleConnecting: "connect " + peer.str() + ": " + strerror).
    line = (
        "  what():  [/src/gloo/transport/tcp/pair.cc:799] connect [10.9.0.2]:8066: No route to host"
    )
    places = {
        0: RankPlace(0, "host1", 11, "eth0", "10.9.0.1"),
        1: RankPlace(1, "host2", 12, "eth0", "10.9.0.2"),
    }
    message = explain_unreachable_peer(0, gloo_failure([line]), places)
    assert message.startswith(
        "Horovod rank 0 on host host1 could not connect to its peer at 10.9.0.2 (rank 1 on "
        "host host2): No route to host"
    ), message
    assert "It offers its peers 10.9.0.1 on interface eth0 (HOROVOD_GLOO_IFACE)." in message
    assert "A firewall or the routing between 10.9.0.1 and 10.9.0.2 blocks" in message


@contextlib.contextmanager
def _two_namespaces():
    """Namespaces ``errors-<pid>-a`` (10.213.7.1) and ``-b`` (10.213.7.2) on a veth pair, with
    nothing routed out of them; deleted after."""
    names = [f"errors-{os.getpid()}-{x}" for x in "ab"]
    veths = [f"errv{os.getpid() % 100000}{x}" for x in "ab"]
    made = []
    try:
        for ns in names:
            subprocess.run(["ip", "netns", "add", ns], check=True)
            made.append(ns)
        subprocess.run(
            ["ip", "link", "add", veths[0], "type", "veth", "peer", "name", veths[1]], check=True
        )
        for ns, veth, addr in zip(names, veths, ["10.213.7.1/30", "10.213.7.2/30"]):
            subprocess.run(["ip", "link", "set", veth, "netns", ns], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", addr, "dev", veth], check=True)
            for dev in ("lo", veth):
                subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        yield names
    finally:
        for ns in made:  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "delete", ns], check=False)


SERVER = (
    "import sys, time\n"
    "from horovod.runner.http.http_server import RendezvousServer\n"
    "from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts\n"
    "server = RendezvousServer(0)\n"
    "port = server.start()\n"
    "server.init(get_host_assignments(parse_hosts('hosta:1,hostb:1'), 2))\n"
    "print(port, flush=True)\n"
    "sys.stdin.read()\n"
)
RANK = (
    "from keras_dl.distribute.network_errors import report_rank_start\n"
    "report_rank_start()\n"
    "import horovod.tensorflow as hvd\n"
    "hvd.init()\n"
)


@pytest.mark.slow
@HEAVY
def test_a_rank_refused_by_its_peers_loopback_address_is_named(tmp_path):
    _needs(os.geteuid() == 0 and shutil.which("ip") is not None, "needs root and `ip netns`")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with _two_namespaces() as (ns_a, ns_b):
        server = subprocess.Popen(
            # The real interpreter: a warm one is forked from the suite's server, outside the
            # namespace (tests/warm_python.py).
            ["ip", "netns", "exec", ns_a, REAL_PYTHON, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ranks = []
        try:
            port = server.stdout.readline().strip()
            common = {
                "HOROVOD_SIZE": "2",
                "HOROVOD_LOCAL_RANK": "0",
                "HOROVOD_LOCAL_SIZE": "1",
                "HOROVOD_CROSS_SIZE": "2",
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.213.7.1",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_GLOO_IFACE": "lo",
                # On a loaded machine one rank's TF import can outlast Gloo's 30 s rendezvous.
                "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
            }
            for rank, (ns, host) in enumerate([(ns_a, "hosta"), (ns_b, "hostb")]):
                (tmp_path / f"rank.{rank}").mkdir()
                rank_env = {**env, **common, "HOROVOD_RANK": str(rank)}
                rank_env |= {"HOROVOD_CROSS_RANK": str(rank), "HOROVOD_HOSTNAME": host}
                with open(tmp_path / f"rank.{rank}" / "stderr", "w") as err:
                    cmd = ["ip", "netns", "exec", ns, REAL_PYTHON, "-c", RANK]
                    ranks.append(subprocess.Popen(cmd, stderr=err, env=rank_env))
            deadline = time.monotonic() + 240
            while all(r.poll() is None for r in ranks) and time.monotonic() < deadline:
                time.sleep(0.5)
            first = next((i for i, r in enumerate(ranks) if r.poll() is not None), None)
            assert first is not None, "neither rank ended in 240 s"
        finally:
            for p in [*ranks, server]:
                if p.poll() is None:
                    p.kill()
                p.wait()
    code = ranks[first].returncode
    assert code in (-6, 134), (code, (tmp_path / f"rank.{first}" / "stderr").read_text())
    exc = RuntimeError(HOROVOD.format(rank=first, code=code))
    message = str(explain_failure(exc, str(tmp_path), size=2))
    assert (
        f"Horovod rank {first} on host {os.uname().nodename} could not connect to its peer "
        in message
    )
    assert "at 127.0.0.1" in message and "Connection refused" in message, message
    assert "It offers its peers 127.0.0.1 on interface lo (HOROVOD_GLOO_IFACE)." in message
    assert "/etc/hosts" in message and "memory" not in message


def test_a_multiworker_workers_start_line_gives_its_own_index():
    # Worker 1's line said rank=0 (no HOROVOD_RANK), and a failure named worker 0 on its host.
    from keras_dl.distribute.network_errors import rank_places, this_rank

    assert this_rank({"KERAS_DL_RANK": "1"}).rank == 1
    assert this_rank({"HOROVOD_RANK": "2"}).rank == 2
    assert this_rank({}).rank == 0
    line = io.StringIO()
    report_rank_start({"KERAS_DL_RANK": "1"}, line)
    assert list(rank_places([line.getvalue()])) == [1]
