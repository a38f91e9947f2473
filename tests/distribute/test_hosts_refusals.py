"""What a two-host cluster refuses before any rank trains, naming the host at fault
(tests/fixtures/hosts.py): host 1's interface is ``eth0``, host 2's ``ens5``.

- A run folder and a SQLite store on the driver's local disk (``Network.local``: the same path,
  another folder on each host) are refused by the shared-storage check, naming host 2 and its
  address, the settings and the fix, before the MLflow run exists.
- With shared storage, Horovod on hosts that share no interface name is refused at once,
  naming each host's interfaces and the rule, where Horovod itself waits
  ``runtime.start_timeout`` and reports task slots.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import HOSTS, HOSTS_PATIENCE, REPO
from tests.distribute.hosts_driver import store_on, train_command
from tests.distribute.test_hosts_horovod import ingest_digits

pytestmark = [HOSTS, HOSTS_PATIENCE, pytest.mark.slow]  # see tests/conftest.py


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)  # the CLI wraps its message at 100 columns


def test_private_folders_and_unshared_interface_names_are_refused_naming_the_hosts(
    host_cluster,
):
    cluster = host_cluster(2, ifaces={"h2": "ens5"})
    h1, h2 = cluster.network.hosts
    table = cluster.s3_uri("digits")
    ingest_digits(cluster, h1, table)

    local = cluster.network.local
    run_dir, sqlite = local / "runs" / "digits", f"sqlite:///{local / 'mlflow.db'}"
    cmd = train_command("horovod", 2, table, sqlite, str(run_dir), "train.epochs=1")
    done = h1.run(cmd, env=cluster.env(h1), cwd=REPO, timeout=600)

    err = _flat(done.stderr)
    print(f"local folders, exit {done.returncode}: {err[-1500:]}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-4000:]
    assert "runtime.np=2: rank 0 runs on whichever host" in err, err[-3000:]
    assert f"runtime.run_dir={run_dir} is not the same folder on every host" in err
    assert f"tracking.uri={sqlite} is not the same folder on every host" in err
    assert f"host h2 ({h2.address}) did not find it in {run_dir}" in err
    assert "host h1 (" not in err  # the driver's own host sees its folders
    assert "runtime.run_dir=s3://BUCKET/PATH" in err and "an MLflow tracking server" in err
    assert "Traceback" not in done.stderr

    cmd = train_command(
        "horovod", 2, table, cluster.tracking_uri, cluster.s3_uri("runs/ifaces"), "train.epochs=1"
    )
    done = h1.run(cmd, env=cluster.env(h1), cwd=REPO, timeout=600)

    err = _flat(done.stderr)
    print(f"eth0 and ens5, exit {done.returncode}: {err[-1500:]}")
    assert done.returncode != 0, done.stdout[-2000:]
    assert "run on 2 hosts that share no network interface name (lo aside)" in err, err[-3000:]
    assert f"h1: eth0 ({h1.address})" in err and f"h2: ens5 ({h2.address})" in err, err[-3000:]
    assert "HOROVOD_GLOO_IFACE" in err and "the same on every host" in err
    assert "task slots" not in err and "OOM" not in err  # not Horovod's own wait, no guess
    (run,) = store_on(cluster, h1)["runs"]  # the storage refusal made none; this one failed
    assert run["status"] == "FAILED", run["tags"]
