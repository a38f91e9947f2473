"""What the tests on the cluster of hosts run on a host: a new user's ``keras-dl train``, and
questions to the cluster's MLflow server (which the test process, in the root namespaces, cannot
reach).

``python -m tests.distribute.hosts_driver runs URI NAME`` prints, as one JSON line: every run of
the store at URI (status, params, tags, each metric's history) and the registered versions of
model NAME.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.fixtures.cluster import HostCluster
    from tests.fixtures.hosts import Host

# Small and quick: digits (1,797 rows), no validation split, no plots.
TRAIN_SETS = ("data.validation_split=", "train.verbose=2", "callbacks.plots=false")


def train_command(strategy: str, np: int, table: str, tracking: str, run_dir: str, *sets: str):
    """``keras-dl train digits`` with ``runtime.strategy=strategy`` on ``np`` Spark tasks."""
    cmd = ["python", "-m", "keras_dl.cli", "train", "digits"]
    for item in (
        f"runtime.strategy={strategy}",
        f"runtime.np={np}",
        f"data.table={table}",
        f"tracking.uri={tracking}",
        f"runtime.run_dir={run_dir}",
        *TRAIN_SETS,
        *sets,
    ):
        cmd += ["--set", item]
    return cmd


def store_on(cluster: HostCluster, host: Host, model: str = "digits") -> dict:
    """Every run and ``model``'s versions in the cluster's MLflow server, asked from ``host``."""
    from tests.conftest import REPO

    cmd = ["python", "-m", "tests.distribute.hosts_driver", "runs", cluster.tracking_uri, model]
    done = host.run(cmd, env=cluster.env(host), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


class RankWatch:
    """Which ranks ran on which host: every 0.2 s, the processes in each host's network
    namespace whose environment sets ``var`` (``HOROVOD_RANK`` for Horovod's ranks), until
    :meth:`stop`. ``seen`` is ``{hostname: {rank, ...}}``."""

    def __init__(self, hosts: list[Host], var: str = "HOROVOD_RANK"):
        self.hosts, self.var = hosts, var.encode()
        self.seen: dict[str, set] = {h.name: set() for h in hosts}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, set]:
        self._stop.set()
        self._thread.join()
        return self.seen

    def _watch(self) -> None:
        prefix = self.var + b"="
        while not self._stop.wait(0.2):
            for host in self.hosts:
                for pid in host.pids():
                    try:
                        with open(f"/proc/{pid}/environ", "rb") as f:
                            env = f.read().split(b"\0")
                    except OSError:
                        continue
                    for item in env:
                        if item.startswith(prefix):
                            self.seen[host.name].add(int(item[len(prefix) :]))


def _print_store(uri: str, model: str) -> None:
    import mlflow

    client = mlflow.MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = []
    for run in client.search_runs(exps) if exps else []:
        metrics = {
            key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in run.data.metrics
        }
        runs.append(
            {
                "run_id": run.info.run_id,
                "status": run.info.status,
                "params": run.data.params,
                "tags": run.data.tags,
                "metrics": metrics,
            }
        )
    versions = [
        {"version": v.version, "run_id": v.run_id}
        for v in client.search_model_versions(f"name='{model}'")
    ]
    print(json.dumps({"runs": runs, "versions": versions}))


if __name__ == "__main__":
    if sys.argv[1] == "runs":
        _print_store(sys.argv[2], sys.argv[3])
