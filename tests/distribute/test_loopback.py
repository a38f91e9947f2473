"""Servers keras_dl starts listen on loopback unless runtime.bind_address widens them."""

from __future__ import annotations

import ipaddress
import os

import psutil
import pytest

from keras_dl.distribute.loopback import spark_conf
from keras_dl.errors import DistributedError
from keras_dl.launch import HorovodRunner
from tests.conftest import HEAVY


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 or an IPv4-mapped loopback (Java listens on ``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def listening(root_pid: int) -> list[tuple[int, str, str, int]]:
    """``(pid, name, ip, port)`` of every listening TCP socket of ``root_pid`` and its children."""
    root = psutil.Process(root_pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="tcp")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [
            (proc.pid, name, c.laddr.ip, c.laddr.port)
            for c in conns
            if c.status == psutil.CONN_LISTEN
        ]
    return found


def list_sockets_while_up(driver_pid: int):
    """Rank function: with every rank in the Gloo world, list the job's listening sockets."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    # Both allreduces are collectives: every rank (and so every Gloo listener) is up for the
    # first, and none has exited before rank 0 finished listing for the second.
    hvd.allreduce(tf.constant(1.0), name="up")
    found = listening(driver_pid) if hvd.rank() == 0 else []
    hvd.allreduce(tf.constant(1.0), name="listed")
    return found


@pytest.mark.slow
@HEAVY
def test_a_local_horovod_job_listens_only_on_loopback():
    before = {(pid, port) for pid, _, _, port in listening(os.getpid())}
    found = HorovodRunner(np=-2).run(list_sockets_while_up, driver_pid=os.getpid())
    new = [s for s in found if (s[0], s[3]) not in before]
    # The driver's Horovod rendezvous and key-value servers were up while the ranks listed.
    assert len([s for s in new if s[0] == os.getpid()]) >= 2, new
    wide = [s for s in new if not is_loopback(s[2])]
    assert not wide, f"listening beyond loopback: {wide}"


SPARK_SCRIPT = """
import json, os
from tests.distribute.test_loopback import listening
from keras_dl.inference.tables import spark_session

spark = spark_session("local[1]", app_name="keras_dl-loopback-test")
try:
    print("RESULT " + json.dumps({
        "ui": spark.sparkContext.uiWebUrl,
        "bind": spark.conf.get("spark.driver.bindAddress"),
        "sockets": listening(os.getpid()),
    }))
finally:
    spark.stop()
"""


@pytest.mark.slow
def test_a_local_spark_session_made_by_keras_dl_listens_on_loopback_without_ui():
    # A fresh interpreter: in the suite's own process another test's session would be reused.
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", SPARK_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    assert out["ui"] is None and out["bind"] == "127.0.0.1"
    # The JVM's driver RPC and block manager, and py4j's gateway.
    assert len([s for s in out["sockets"] if s[1] == "java"]) >= 2, out["sockets"]
    wide = [s for s in out["sockets"] if not is_loopback(s[2])]
    assert not wide, f"listening beyond loopback: {wide}"


def test_spark_conf_binds_the_driver_to_loopback_only_on_local_masters():
    daemon = {"spark.python.daemon.module": "keras_dl.spark_daemon"}
    assert spark_conf("local[2]") == {
        "spark.ui.enabled": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        **daemon,
    }
    # A cluster's executors must reach the driver: its address is left to Spark.
    assert spark_conf("spark://head:7077", ui=True) == {"spark.ui.enabled": "true", **daemon}
    assert spark_conf("local", bind_address="0.0.0.0")["spark.driver.host"] == "127.0.0.1"


def test_a_local_job_refuses_an_address_its_ranks_cannot_reach():
    with pytest.raises(DistributedError, match="reach the driver at 127.0.0.1"):
        HorovodRunner(np=-2, bind_address="10.1.2.3")
    with pytest.raises(DistributedError, match="not an IPv4 address"):
        HorovodRunner(np=-2, bind_address="localhost")
    HorovodRunner(np=-2, bind_address="0.0.0.0")  # every interface, asked for explicitly
    HorovodRunner(np=2, bind_address="10.1.2.3")  # Spark: the user's choice
