"""Where a rank runs, and what Gloo's network failures mean.

Each rank writes one line to its stderr as it starts (:func:`report_rank_start`): its host, its
process id and the interface and address it offers its peers. A rank that aborts in native code
(Gloo throws ``gloo::IoException`` from its own thread: ``terminate called ...``, SIGABRT)
writes no Python report, but its stderr still holds that line and Gloo's, and the launcher keeps
a copy of both; :func:`rank_places` and :func:`gloo_failure` read them back, and
:func:`explain_unreachable_peer` says what the failure is and how to fix it.

Gloo's words (``third_party/gloo/gloo/transport/tcp/pair.cc`` in Horovod 0.28.1), e.g.
``gloo::IoException: [/.../pair.cc:799] connect [127.0.0.1]:29076: Connection refused``. Gloo
prints the peer's port as ``sin_port`` unconverted (network byte order): it is not the port
number the peer listens on, so the messages here quote it only inside Gloo's own text.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
from dataclasses import dataclass

_STARTED = "keras_dl rank started:"
_STARTED_RE = re.compile(
    re.escape(_STARTED) + r" rank=(\d+) host=(\S+) pid=(\d+) iface=(\S+)"
    r" address=(\S+) hostname=(\S+)"
)
# "connect [ADDR]:PORT: reason" from the connecting side of a pair (pair.cc handleConnecting),
# and "connect: reason" when the connect call itself failed (no route: ENETUNREACH).
_CONNECT_RE = re.compile(
    r"\[[^\[\]]*pair\.cc:\d+\] connect"
    r"(?: \[(?P<addr>[^\]]+)\](?::(?P<port>\d+))?(?:\$\d+)?)?: (?P<why>[^\n]+)"
)
# A rank that waited at the Gloo rendezvous (horovod/common/gloo/http_store.cc) for peers that
# never wrote their key; the keys are the ranks (Horovod's store: "1"; Gloo's: "rank_1"), maybe
# prefixed, separated by spaces.
_WAIT_RE = re.compile(r"Wait timeout after (?P<secs>\d+) seconds for key\(s\): (?P<keys>.*?)\. You")
_NONE = "-"
# Horovod's own timeout, when the tasks registered but could not reach one another
# (horovod/spark/runner.py, _notify_and_register_task_addresses).
TASK_TO_TASK_TIMEOUT = "Timed out waiting for Spark tasks to update task-to-task addresses"


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs, as it reported at its start.

    Attributes:
        rank: Its Horovod rank.
        host: Its host's name (``socket.gethostname()``).
        pid: Its process id on that host.
        iface: ``HOROVOD_GLOO_IFACE``, the interface Gloo binds ("" when unset).
        address: That interface's IPv4 address on the rank's host ("" when unknown).
        hostname: ``HOROVOD_HOSTNAME`` (what Horovod names the host; on Spark a hash).
    """

    rank: int
    host: str
    pid: int
    iface: str = ""
    address: str = ""
    hostname: str = ""

    def describe(self) -> str:
        """E.g. "10.0.0.2 on interface eth0 (HOROVOD_GLOO_IFACE)", or what is known."""
        if self.iface:
            where = f"{self.address or 'no IPv4 address'} on interface {self.iface}"
            return f"{where} (HOROVOD_GLOO_IFACE)"
        return f"what host name {self.hostname or self.host!r} resolves to (no HOROVOD_GLOO_IFACE)"


@dataclass(frozen=True)
class GlooFailure:
    """A Gloo connect failure: the address a rank tried and why it failed."""

    address: str  # "" when Gloo did not print it ("connect: Network is unreachable")
    reason: str
    line: str  # Gloo's own words, from "[...pair.cc" on


def report_rank_start(environ=os.environ, stream=None) -> None:
    """On a rank, before ``hvd.init``: write its start line (host, pid, interface, address)."""
    place = this_rank(environ)
    stream = stream or sys.stderr
    fields = [place.iface, place.address, place.hostname]
    iface, address, hostname = (v or _NONE for v in fields)
    stream.write(
        f"{_STARTED} rank={place.rank} host={place.host} pid={place.pid} iface={iface} "
        f"address={address} hostname={hostname}\n"
    )
    stream.flush()


def this_rank(environ=os.environ) -> RankPlace:
    """This process as a :class:`RankPlace`, from Horovod's (or the multi-worker strategy's)
    environment and its interfaces."""
    iface = environ.get("HOROVOD_GLOO_IFACE", "")
    return RankPlace(
        # A multi-worker worker's index is KERAS_DL_RANK (keras_dl.launch.spark_workers.RANK).
        rank=int(environ.get("HOROVOD_RANK") or environ.get("KERAS_DL_RANK") or 0),
        host=socket.gethostname(),
        pid=os.getpid(),
        iface=iface,
        address=_ipv4_of(iface) if iface else "",
        hostname=environ.get("HOROVOD_HOSTNAME", ""),
    )


def rank_places(lines) -> dict[int, RankPlace]:
    """The start lines among ``lines`` (any prefix), by rank: the first of each."""
    places: dict[int, RankPlace] = {}
    for line in lines:
        m = _STARTED_RE.search(line)
        if m and int(m.group(1)) not in places:
            rank, host, pid, iface, address, hostname = m.groups()
            places[int(rank)] = RankPlace(
                int(rank),
                host,
                int(pid),
                *(v if v != _NONE else "" for v in (iface, address, hostname)),
            )
    return places


def gloo_failure(lines) -> GlooFailure | None:
    """The first Gloo connect failure among ``lines``, or None."""
    for line in lines:
        m = _CONNECT_RE.search(line)
        if m:
            return GlooFailure(m.group("addr") or "", m.group("why").strip(), m.group(0).strip())
    return None


def explain_unreachable_peer(rank: int, failure: GlooFailure, places: dict[int, RankPlace]) -> str:
    """What a rank that could not connect to a peer should be told: both addresses, the
    interface, and the fix."""
    me = places.get(rank)
    where = f" on host {me.host}" if me else ""
    peer = failure.address or "a peer"
    owner = [p for p in places.values() if p.rank != rank and failure.address in (p.address,)]
    peer_name = f" (rank {owner[0].rank} on host {owner[0].host})" if owner else ""
    mine = (
        f"It offers its peers {me.describe()}."
        if me
        else "Its interface is unknown (it wrote no start line)."
    )
    text = (
        f"Horovod rank {rank}{where} could not connect to its peer at {peer}{peer_name}: "
        f"{failure.reason} (Gloo: {failure.line}), and aborted, so the job was stopped. {mine} "
    )
    if failure.address and _is_loopback(failure.address):
        return text + (
            "A peer that offers 127.0.0.1 has its own host name on a loopback address (its "
            "/etc/hosts), and its Horovod lacks keras_dl's Gloo patch, with which every process "
            "set binds HOROVOD_GLOO_IFACE (scripts/build_horovod.sh). Rebuild Horovod with that "
            "script on every host, or map each host's name to its own address in /etc/hosts."
        )
    mine_addr = me.address if me and me.address else f"rank {rank}'s host"
    return text + (
        f"A firewall or the routing between {mine_addr} and {peer} blocks the connection: "
        "allow TCP between the hosts on every port (Gloo listens on ephemeral ports)."
    )


def explain_task_to_task_timeout(horovod_text: str) -> str:
    """What Horovod's "Timed out waiting for Spark tasks to update task-to-task addresses"
    means: the tasks started and registered, then could not reach one another."""
    return (
        "The Spark tasks started, but could not reach one another before runtime.start_timeout "
        f"ran out (Horovod: {horovod_text.strip().splitlines()[0]!r}). Horovod on Spark connects "
        "two tasks only over an interface of the same name on both hosts (lo aside): hosts whose "
        "interfaces are named differently (eth0 on one, ens5 on another) never match, and the "
        "executors' logs on the workers say 'Horovod was unable to connect to ... with the same "
        "name across all of the hosts'. Name the interfaces the same on every host (a systemd "
        ".link file or udev rule; `ip link set DEV name NAME`): Horovod's nics= does not help, it "
        "only narrows the names every host must share. If the names match, a firewall between "
        "the hosts blocks the tasks' ports: allow TCP between them."
    )


# -- private helpers ---------------------------------------------------------------------------


def _ipv4_of(iface: str) -> str:
    import psutil

    for addr in psutil.net_if_addrs().get(iface, []):
        if addr.family == socket.AF_INET:
            return addr.address
    return ""


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def explain_rendezvous_timeout(rank: int, lines, places: dict[int, RankPlace]) -> str | None:
    """What a rank whose Gloo rendezvous timed out should be told (the peers it waited for,
    and the two causes), or None when its output has no such timeout."""
    m = next((m for m in map(_WAIT_RE.search, lines) if m), None)
    if m is None:
        return None
    peers = sorted({int(r) for r in re.findall(r"(\d+)(?=\s|$)", m.group("keys"))})
    named = ", ".join(
        f"{p} (on host {places[p].host})" if p in places else f"{p} (no start line: it never ran)"
        for p in peers
    )
    me = places.get(rank)
    return (
        f"Horovod rank {rank}{f' on host {me.host}' if me else ''} waited {m.group('secs')} s at "
        f"the Gloo rendezvous (the driver's HTTP store) for rank(s) {named or m.group('keys')}, "
        "which never registered, and aborted, so the job was stopped. Those ranks did not reach "
        "hvd.init() in time (an error of their own: check their output above; or a slow start: "
        "raise HOROVOD_GLOO_TIMEOUT_SECONDS, 30 by default), or their hosts cannot reach the "
        "rendezvous server (HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT in their environment): allow "
        "TCP from them to the driver's address on that port."
    )
