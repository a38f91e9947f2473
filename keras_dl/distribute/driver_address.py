"""Executors that cannot connect back to the driver: said so, instead of "too few task slots".

On a standalone cluster the master launches executors on its workers, and each executor then
connects to the driver at the address the driver advertises (``spark.driver.host``, by default
this host's name resolved, and ``spark.driver.port``). One that cannot (a multi-homed driver
advertising the wrong interface, a host name on 127.0.x.x, a firewall) exits after its retries,
the master launches another, and the driver only sees fewer executors than the cluster has:
the free-slot check (:mod:`keras_dl.distribute.slots`) then blames the slot count.

The evidence, read here: the master's JSON at its web UI (``http://MASTER_HOST:PORT/json/``, the
port from ``SPARK_MASTER_WEBUI_PORT`` as for the master's daemon, 8080 by default), which gives
the cores granted to this application and the workers' free cores; the executors registered
with this driver (its status tracker); and a connection from this host to the advertised
address, which fails at once when the driver listens elsewhere (``spark.driver.bindAddress``).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from urllib.parse import urlparse


def explain_unregistered_executors(sc, np: int) -> str | None:
    """The error for a job whose executors were launched but did not register with this driver,
    or None when the evidence does not say so (a busy cluster: then too few slots it is).

    Args:
        sc: The driver's SparkContext (classic; a ``spark://`` master).
        np: The Spark tasks the job needs.
    """
    if not str(sc.master).startswith("spark://"):
        return None
    conf = sc.getConf()
    host = conf.get("spark.driver.host", None) or socket.gethostname()
    port = conf.get("spark.driver.port", None) or "?"
    refused = _refuses(host, port)
    # Cores the master gave this application that no registered executor holds: executors that
    # started and never reached the driver (the master relaunches each as it exits: sampled a
    # few times, since between two launches none is granted).
    for attempt in range(3):
        registered = registered_executor_cores(sc)
        master = master_state(sc.master)
        app = _application(master, sc.applicationId)
        granted = int(app.get("cores", 0)) if app else 0
        lost = granted > registered
        if lost or master is None or attempt == 2:
            break
        time.sleep(1.0)
    workers = (master or {}).get("workers", [])
    free = sum(int(w.get("coresfree", 0)) for w in workers if w.get("state") == "ALIVE")
    if not (lost or refused):
        return None
    seen = (
        f"The master at {sc.master} (its web UI's JSON) granted this application {granted} core(s) "
        f"and has {free} free core(s) on its alive workers, while the executors registered with "
        f"this driver hold {registered}. "
        if master is not None
        else ""
    )
    why = (
        f"From this host, {host}:{port} refuses connections ({refused}): the driver listens on "
        f"{conf.get('spark.driver.bindAddress', None) or 'another address'} "
        "(spark.driver.bindAddress), not on the address it advertises. "
        if refused
        else ""
    )
    return (
        f"runtime.np={np} needs {np} Spark task slots, but the executors could not connect back "
        f"to the driver at {host}:{port} (its advertised address: spark.driver.host={host}, "
        f"spark.driver.port={port}), so they exited. {seen}{why}Set spark.driver.host (or "
        "SPARK_LOCAL_IP) to an address of this host the workers reach; on a multi-homed host, "
        "the one on the workers' network, and allow TCP from the workers to it (spark.driver.port "
        "and spark.blockManager.port). The executors' own logs (each worker's work folder, "
        "app-*/N/stderr) say 'Failed to connect to ...'."
    )


def executors_launching(sc) -> bool:
    """True while the master has granted this application cores that no registered executor
    holds yet and the driver's advertised address does not refuse connections: executors still
    starting (a loaded host takes tens of seconds per JVM), not executors that cannot connect.
    Also True when the master's web UI cannot be read: it cannot tell."""
    if not str(sc.master).startswith("spark://"):
        return False
    state = master_state(sc.master)
    if state is None:  # its web UI did not answer (a loaded master, another port): maybe
        return True  # the caller's wait is bounded (LAUNCH_WAIT), an error at its end names it
    app = _application(state, sc.applicationId)
    if app is None or int(app.get("cores", 0)) <= registered_executor_cores(sc):
        return False
    conf = sc.getConf()
    host = conf.get("spark.driver.host", None) or socket.gethostname()
    return not _refuses(host, conf.get("spark.driver.port", None) or "?")


def registered_executor_cores(sc) -> int:
    """Cores of the executors registered with this driver now (the driver itself left out)."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    task_cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    return int(jsc.maxNumConcurrentTasks(profile)) * task_cpus


def master_state(master: str, timeout: float = 10.0) -> dict | None:
    """The standalone master's JSON (``/json/`` at its web UI), or None when it cannot be read."""
    host = urlparse(master.split(",")[0]).hostname
    port = os.environ.get("SPARK_MASTER_WEBUI_PORT", "8080")
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/json/", timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


# -- private helpers ---------------------------------------------------------------------------


def _application(master: dict | None, app_id: str) -> dict | None:
    return next((a for a in (master or {}).get("activeapps", []) if a.get("id") == app_id), None)


def _refuses(host: str, port: str) -> str:
    """Why a TCP connection from here to ``host:port`` fails at once ("" when it connects, or
    when it does not answer within a second: that is no proof)."""
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return ""
    except ConnectionRefusedError as exc:
        return exc.strerror or "Connection refused"
    except (OSError, ValueError):
        return ""
