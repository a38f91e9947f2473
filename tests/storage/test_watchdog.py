"""The watchdog: a store call that hangs past the run's lease ends the process with exit 75, its
MLflow run KILLED. Azurite paused (SIGSTOP): pyarrow's Azure client waits for it without end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import mlflow
import pytest

from keras_dl.storage import watchdog
from tests.azurite import AzureContainer, AzuriteServer, point_azure_at
from tests.conftest import HEAVY_IO, REPO, seed_store

CHILD = textwrap.dedent(
    """
    import sys
    from keras_dl.config import resolve
    from keras_dl.distribute.world import World
    from keras_dl.recipe import load_recipe
    from keras_dl.run import open_run
    from keras_dl.storage import open_store, watchdog

    table, run_dir, uri = sys.argv[1:4]
    watchdog.install()  # as keras-dl train does
    sets = [f"data.table={table}", f"runtime.run_dir={run_dir}", "runtime.lease_seconds=6",
            f"tracking.uri={uri}"]
    exp = resolve(load_recipe("digits").defaults, sets=sets)
    with open_run(exp, World()) as run:
        print(run.start(), flush=True)
        sys.stdin.readline()  # the store is paused now
        open_store(run_dir).write("probe.json", b"{}")  # waits on the paused store
    print("the write returned", flush=True)
    """
)


def test_nothing_is_overdue_without_a_lease_or_a_call_in_flight():
    assert watchdog.overdue() is None


@pytest.mark.slow
@HEAVY_IO
def test_a_store_call_hung_past_the_lease_exits_75_and_the_run_ends_killed(tmp_path, monkeypatch):
    server = AzuriteServer().ensure()  # its own: paused, it would stall other tests
    try:
        point_azure_at(server, monkeypatch)
        container = AzureContainer(server, "lake")
        container.client().create_container()
        uri = seed_store(tmp_path / "mlflow.db")
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path / "t"), container.uri("run"), uri],
            env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            run_id = child.stdout.readline().strip()
            assert run_id, child.stderr.read()[-3000:]
            os.kill(server.proc.pid, signal.SIGSTOP)
            child.stdin.write("go\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 75, err[-3000:]
        assert "the write returned" not in out
        assert "error: Object store abfss://lake@" in err, err[-3000:]
        assert "run the same command again" in err
        run = mlflow.MlflowClient(uri).get_run(run_id)
        assert run.info.status == "KILLED"
        assert run.data.tags["preempted"] == "STORE_UNAVAILABLE", run.data.tags
    finally:
        with contextlib.suppress(Exception):
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
