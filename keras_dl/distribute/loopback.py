"""Servers keras_dl starts listen on loopback (``runtime.bind_address``) unless widened.

Horovod 0.28.1 binds every server it starts to all interfaces: ``horovod/runner/util/network.py``
line 84 (``find_port``)::

    addr = ('', port)

That covers the driver's rendezvous server (``http/http_server.py`` ``RendezvousServer``), its
key-value store (``KVStoreServer``, which ``horovod.runner.run`` uses to ship the function to
the ranks and their results back) and the driver and task services (``common/util/network.py``
``BasicService``). The key-value store takes unauthenticated PUTs of pickles that the driver
unpickles, so on a shared network anyone could run code in the driver. For a job on this host
(``np < 0``) nothing outside the host has to reach them: the ranks connect to 127.0.0.1
(Horovod picks the interface holding 127.0.0.1 when every host is local).

:func:`bound_to` makes ``find_port`` bind the given address, and :func:`spark_conf` gives a
SparkSession on a local master a driver that listens on loopback and no web UI.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import threading
from collections.abc import Iterator

from keras_dl.errors import DistributedError

LOOPBACK = "127.0.0.1"
# Spark's Python worker daemon for keras_dl's sessions: pyspark's, with TensorFlow, Keras and
# MLflow imported once before it forks the workers (see the module). A name for Spark's
# configuration, never imported here: the daemon is an entry point at the top of the layers.
DAEMON = "keras_dl.spark_daemon"
_lock = threading.Lock()


@contextlib.contextmanager
def bound_to(address: str) -> Iterator[None]:
    """Within this block, Horovod's servers started in this process listen on ``address``.

    Args:
        address: An IPv4 address of this host, or "0.0.0.0" for every interface (Horovod's
            own behaviour).

    Raises:
        DistributedError: When ``address`` is not an IPv4 address (Horovod's servers are IPv4).
    """
    _check_ipv4(address)
    import horovod.runner.common.util.network as service_network
    import horovod.runner.http.http_server as http_server
    import horovod.runner.util.network as util_network

    def find_port(server_factory):
        # Port 0: the kernel picks a free port (Horovod tries random ports until one binds).
        server = server_factory((address, 0))
        return server, server.socket.getsockname()[1]

    # `from horovod.runner.util.network import find_port` copied it into the two server
    # modules: patch all three. The lock keeps a concurrent job from restoring the original
    # under this one (Horovod's launcher installs signal handlers, so jobs run one at a time
    # in a process anyway).
    modules = (util_network, http_server, service_network)
    with _lock:
        saved = [module.find_port for module in modules]
        for module in modules:
            module.find_port = find_port
        try:
            yield
        finally:
            for module, original in zip(modules, saved):
                module.find_port = original


def check_local_job_address(address: str) -> None:
    """Raise unless ``address`` works for a job on this host: loopback or every interface.

    The ranks of an ``np < 0`` job reach the driver at 127.0.0.1 (Horovod's choice for local
    hosts), so a server bound to another single address would be unreachable to them.
    """
    _check_ipv4(address)
    ip = ipaddress.ip_address(address)
    if not (ip.is_loopback or ip.is_unspecified):
        raise DistributedError(
            f"runtime.bind_address={address!r} cannot serve a job on this host (runtime.np < 0): "
            "its ranks reach the driver at 127.0.0.1. Use 127.0.0.1 (the default), or 0.0.0.0 "
            "to listen on every interface."
        )


def spark_conf(master: str | None, *, bind_address: str = LOOPBACK, ui: bool = False) -> dict:
    """Spark settings for a session keras_dl creates: a loopback driver on local masters.

    Args:
        master: The session's master URL; None reads ``MASTER`` or ``spark-defaults.conf``
            (Spark's own sources) and falls back to ``local[*]``.
        bind_address: Where the driver listens on a local master, whose executors are in the
            driver's JVM. Ignored on a cluster master, whose executors must reach the driver.
            Defaults to "127.0.0.1".
        ui: Start Spark's web UI (it listens on every interface). Defaults to False.

    Returns:
        ``{key: value}`` to pass to ``SparkSession.builder.config``. On every master, Spark's
        Python workers fork from :mod:`keras_dl.spark_daemon`, which has imported
        TensorFlow, Keras and MLflow once.
    """
    conf = {"spark.ui.enabled": "true" if ui else "false", "spark.python.daemon.module": DAEMON}
    if _is_local(master if master is not None else _configured_master()):
        conf["spark.driver.bindAddress"] = bind_address
        # The address the driver advertises to its (in-JVM) executors and block manager.
        conf["spark.driver.host"] = LOOPBACK if _unspecified(bind_address) else bind_address
    return conf


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def _configured_master() -> str:
    """The master Spark would use when none is set in code."""
    return configured_master() or "local[*]"


def configured_master() -> str | None:
    """The master ``MASTER`` or ``spark-defaults.conf`` names; None when neither does."""
    if os.environ.get("MASTER"):
        return os.environ["MASTER"]
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as f:
            for line in f:
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] == "spark.master":
                    return parts[1].strip()
    except OSError:
        pass
    return None


def _unspecified(address: str) -> bool:
    return address in ("", "0.0.0.0")


def _check_ipv4(address: str) -> None:
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise DistributedError(
            f"runtime.bind_address={address!r} is not an IPv4 address. Use 127.0.0.1 (the "
            "default, this host only) or 0.0.0.0 (every interface)."
        ) from None
