"""Interface names across the hosts of a Horovod on Spark job: checked before Horovod starts.

Horovod on Spark (``horovod/spark/driver/driver_service.py``, ``get_common_interfaces``, and
``horovod/runner/common/util/network.py``, ``match_intf``) connects two tasks only over an
interface of the same name on both hosts, and gives Gloo the first name all tasks share. Hosts
whose interfaces are named differently (``eth0`` on one, ``ens5`` on another) share none but
``lo``: Horovod then waits ``runtime.start_timeout`` and fails with a message about task slots,
while the rule is written only in the executors' logs. Its ``nics=`` does not help: it only
narrows the names every host must share.

So before Horovod starts, one barrier stage of ``np`` tasks (placed as Horovod's will be)
reports each host's IPv4 interfaces, read as Horovod reads them (``psutil.net_if_addrs()``),
and a job whose hosts share no interface name but ``lo`` is refused at once, naming each host's
interfaces, the rule and the fix. The same probe names the interface Horovod is to use when
its tasks run away from the driver (:func:`check_spark_interfaces`).
"""

from __future__ import annotations

import socket

from keras_dl.errors import DistributedError

LOOPBACK_NAMES = ("lo",)


def task_interfaces() -> dict:
    """This host's name and its interfaces' IPv4 addresses, as Horovod's task service sees them
    (``{"host": ..., "interfaces": {"eth0": ["10.0.0.1"], ...}}``)."""
    import psutil

    interfaces: dict[str, list[str]] = {}
    for name, addresses in psutil.net_if_addrs().items():
        for addr in addresses:
            if addr.family == socket.AF_INET:
                interfaces.setdefault(name, []).append(addr.address)
    return {"host": socket.gethostname(), "interfaces": interfaces}


def check_common_interfaces(probes: list[dict]) -> set[str]:
    """The interface names every probed host has (``lo`` aside).

    Args:
        probes: One :func:`task_interfaces` result per task (several may be one host).

    Raises:
        DistributedError: When the hosts share no interface name but ``lo``.
    """
    hosts: dict[str, dict[str, list[str]]] = {}
    for probe in probes:
        hosts.setdefault(probe["host"], probe["interfaces"])
    names = [set(i) - set(LOOPBACK_NAMES) for i in hosts.values()]
    common = set.intersection(*names) if names else set()
    if common or len(hosts) < 2:
        return common
    listed = "; ".join(f"{host}: {_describe(ifaces)}" for host, ifaces in sorted(hosts.items()))
    raise DistributedError(
        f"The Spark tasks of this Horovod job run on {len(hosts)} hosts that share no network "
        f"interface name (lo aside): {listed}. Horovod on Spark connects two tasks only over an "
        "interface of the same name on both hosts, and gives Gloo that name "
        "(HOROVOD_GLOO_IFACE); without one it would wait runtime.start_timeout and time out "
        "'waiting for Spark tasks to update task-to-task addresses'. Name the interface the "
        "hosts reach each other on the same on every host (a systemd .link file or udev rule; "
        "`ip link set DEV name NAME` while it is down). Horovod's nics= does not help: it only "
        "narrows the names every host must share."
    )


def check_spark_interfaces(sc, np: int) -> list[str] | None:
    """Refuse a job whose Spark executors' hosts share no interface name, before Horovod starts;
    return the interface Horovod is to use (its ``nics=``), or None to leave it Horovod's choice.

    Nothing runs when every executor is on the driver's host (the status tracker says so).
    Otherwise Horovod is given the driver's interface that holds the address the executors
    reach the driver at (``spark.driver.host``), when every task's host has one of that name:
    with all its tasks on one host, Horovod keeps ``lo`` among the names it may use (there is
    no peer to probe) and gives its rendezvous the driver's address on the first name of a set,
    in hash order; on a host other than the driver's, that is 127.0.0.1 in about half the runs,
    and every rank aborts ("HTTP GET request failed too many times", SIGABRT).

    Raises:
        DistributedError: As :func:`check_common_interfaces`.
    """
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    if len({info.host() for info in infos}) < 2:
        return None
    common = check_common_interfaces(probe_spark_interfaces(sc, np))
    name = address_interface(sc.getConf().get("spark.driver.host", socket.gethostname()))
    return [name] if name in common else None


def address_interface(host: str) -> str | None:
    """The name of this machine's interface that holds ``host``'s address (a name or an
    address), or None when none does (a loopback name such as 127.0.1.1, or no such name)."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    for name, addresses in task_interfaces()["interfaces"].items():
        if address in addresses and name not in LOOPBACK_NAMES:
            return name
    return None


def probe_spark_interfaces(sc, np: int) -> list[dict]:
    """:func:`task_interfaces` of each of ``np`` tasks of one barrier stage (all at once, as
    Horovod's tasks will run)."""
    stage = sc.parallelize(range(np), np).barrier()
    return stage.mapPartitions(lambda _: [task_interfaces()]).collect()


# -- private helpers ---------------------------------------------------------------------------


def _describe(interfaces: dict[str, list[str]]) -> str:
    return (
        ", ".join(f"{name} ({', '.join(addrs)})" for name, addrs in sorted(interfaces.items()))
        or "no IPv4 interface"
    )
