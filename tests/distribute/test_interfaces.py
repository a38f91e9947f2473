"""Hosts whose interfaces are named differently are refused before Horovod starts, naming each
host's interfaces, the rule and the fix; Horovod's own timeout from that cause says so too.

The probes are this machine's real interfaces (``psutil``, as Horovod's task service reads
them), the second host's renamed as on a host whose NIC is ``ens5``."""

from __future__ import annotations

import pytest

from keras_dl.distribute.failures import explain_failure
from keras_dl.distribute.interfaces import check_common_interfaces, task_interfaces
from keras_dl.errors import DistributedError


def _renamed(probe: dict, host: str, names: dict[str, str]) -> dict:
    interfaces = {names.get(k, k): v for k, v in probe["interfaces"].items()}
    return {"host": host, "interfaces": interfaces}


def test_hosts_that_share_no_interface_name_are_refused_naming_each_hosts_interfaces():
    here = task_interfaces()
    assert "lo" in here["interfaces"] and "127.0.0.1" in here["interfaces"]["lo"]
    nic = next(n for n in here["interfaces"] if n != "lo")  # this machine's own NIC
    one = _renamed(here, "host1", {nic: "eth0"})
    two = _renamed(here, "host2", {nic: "ens5"})
    with pytest.raises(DistributedError) as info:
        check_common_interfaces([one, two, one])  # two tasks on host1
    message = str(info.value)
    addr = ", ".join(here["interfaces"][nic])
    assert message.startswith("The Spark tasks of this Horovod job run on 2 hosts that share no ")
    assert f"host1: eth0 ({addr}), lo (127.0.0.1)" in message, message
    assert f"host2: ens5 ({addr}), lo (127.0.0.1)" in message
    assert "an interface of the same name on both hosts" in message
    assert "ip link set DEV name NAME" in message and "nics= does not help" in message
    # The same names on both hosts, or one host: what Horovod will use.
    assert check_common_interfaces([one, _renamed(here, "host2", {nic: "eth0"})]) == {"eth0"}
    assert check_common_interfaces([one, one]) == {"eth0"}


def test_horovods_task_to_task_timeout_names_the_interface_rule(tmp_path):
    """Was "The Horovod ranks did not all start: ... Check that the cluster has enough free task
    slots" (horovod/spark/runner.py's Timeout message for this activity)."""
    exc = Exception(
        "Timed out waiting for Spark tasks to update task-to-task addresses. Please check that "
        "you have enough resources to run all Horovod processes. Each Horovod process runs in a "
        "Spark task. You may need to increase the start_timeout parameter to a larger value if "
        "your Spark resources are allocated on-demand. Timeout after 120 seconds."
    )
    message = str(explain_failure(exc, str(tmp_path), size=2))
    assert message.startswith("The Spark tasks started, but could not reach one another")
    assert "an interface of the same name on both hosts (lo aside)" in message
    assert "eth0 on one, ens5 on another" in message and "free task slots" not in message
