"""The test hosts (tests/fixtures/hosts.py) are hosts: names, disks and a network of their own."""

from __future__ import annotations

import os
import socket
import subprocess

from tests.fixtures.hosts import LOOPBACK_NAME_ADDRESS, Network

RESOLVE = "import socket; print(socket.gethostname(), socket.gethostbyname(socket.gethostname()))"


UNREACHABLE = (
    "import socket, sys\n"
    "try: socket.create_connection((sys.argv[1], 9), timeout=2)\n"
    "except OSError as e: print('unreachable' if e.errno == 101 else e)\n"
)


def _root(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _namespaces(net: Network) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"{net.prefix}-")]


def test_hosts_have_their_own_names_disks_and_network(network_factory):
    net = network_factory(2, ifaces={"h2": "ens5"})
    h1, h2 = net.hosts
    assert len(_namespaces(net)) == 4  # h1, h2, svc and the switch

    # Names: each its own, its own name on loopback (the default), the others' on their address.
    assert h1.run(["python", "-S", "-c", RESOLVE]).stdout.split() == ["h1", LOOPBACK_NAME_ADDRESS]
    assert h2.run(["python", "-S", "-c", RESOLVE]).stdout.split() == ["h2", LOOPBACK_NAME_ADDRESS]
    lookup = "import socket; print(socket.gethostbyname('h2'))"
    assert h1.run(["python", "-S", "-c", lookup]).stdout.strip() == h2.address
    assert socket.gethostname() not in ("h1", "h2")  # the root namespace kept its own

    # The same path is a different folder on each host, and neither is the root's.
    assert h1.run(["sh", "-c", f"echo one > {net.local}/f"]).returncode == 0
    assert h2.run(["sh", "-c", f"echo two > {net.local}/f"]).returncode == 0
    assert h1.run(["cat", f"{net.local}/f"]).stdout == "one\n"
    assert h2.run(["cat", f"{net.local}/f"]).stdout == "two\n"
    assert not (net.local / "f").exists()

    # Interfaces as asked, one address each, no route out.
    assert h2.run(["ip", "-o", "-4", "addr", "show", "dev", "ens5"]).stdout.count(h2.address) == 1
    assert "default" not in h1.run(["ip", "route"]).stdout

    # Host 1 reaches host 2 (and svc); nothing leaves the hosts' network: a host has no route
    # out (refused at once, no packet sent) and the root namespace none in (no address or route
    # of the subnet; no packet is sent to check, since the root's default route leads off the
    # machine).
    assert h1.can_reach(h2.address, 9) and h1.can_reach(net.services.address, 9)
    out = h1.run(["python", "-S", "-c", UNREACHABLE, "192.0.2.1"])
    assert out.stdout.strip() == "unreachable", out
    subnet = f"{net.subnet}.0/24"
    assert not _root(["ip", "route", "show", subnet]) and not _root(
        ["ip", "route", "show", "table", "all", subnet]
    )
    assert f"{net.subnet}." not in _root(["ip", "-o", "addr"])
    # A link down cuts the host off; up again, it is back.
    h2.link(False)
    assert not h1.can_reach(h2.address, 9, timeout=1)
    h2.link(True)
    assert h1.can_reach(h2.address, 9)

    # A host killed: its processes gone; the others' still there.
    sleeper1, sleeper2 = h1.popen(["sleep", "600"]), h2.popen(["sleep", "600"])
    h1.entered(sleeper1)
    h2.entered(sleeper2)
    h2.kill()
    assert sleeper2.wait(timeout=10) == -9 and sleeper1.poll() is None

    net.close()
    assert not _namespaces(net)
    assert sleeper1.wait(timeout=10) is not None
    assert not any(os.path.exists(f"/proc/{h.anchor.pid}") for h in net.all_hosts)


def test_names_can_resolve_to_addresses_everywhere(network_factory):
    net = network_factory(2, own_name_on_loopback=False, services=False)
    h1, h2 = net.hosts
    assert h1.run(["python", "-S", "-c", RESOLVE]).stdout.split() == ["h1", h1.address]
    assert h2.run(["python", "-S", "-c", RESOLVE]).stdout.split() == ["h2", h2.address]
    assert net.services is None and len(_namespaces(net)) == 3
