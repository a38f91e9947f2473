"""A tiny model and data for callback tests, and a real MLflow tracking server process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

from tests.warm_python import REAL_PYTHON


def tiny_model(seed: int = 0, classes: int = 3):
    """A compiled 2-layer classifier over 4 features (with dropout, so RNG state matters)."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((4,), name="x"),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def tiny_data(rows: int = 128, classes: int = 3, seed: int = 0):
    """Separable float32 features and integer labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, rows)
    x = rng.normal(size=(rows, 4)).astype("float32") + y[:, None].astype("float32")
    return x, y


def mlflow_server_command(store: str, artifacts: str, address: str, port: int) -> list[str]:
    """``mlflow server`` (one worker) on ``address:port``: runs in ``store``, artifacts proxied
    to ``artifacts`` (a folder or an ``s3://`` URI)."""
    return [
        str(Path(REAL_PYTHON).with_name("mlflow")),
        "server",
        *("--backend-store-uri", store, "--artifacts-destination", artifacts),
        *("--host", address, "--port", str(port), "--workers", "1"),
    ]


class MlflowServer:
    """``mlflow server`` on a free loopback port with a SQLite store; stop and start it again."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> None:
        cmd = mlflow_server_command(
            f"sqlite:///{self.root / 'server.db'}",
            str(self.root / "server-artifacts"),
            "127.0.0.1",
            self.port,
        )
        # Its own session: stop() ends the server and its worker processes, nothing else.
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError((self.root / "server.log").read_text()[-3000:])
            time.sleep(0.3)

    def healthy(self) -> bool:
        import requests

        try:
            return requests.get(self.uri + "/health", timeout=1).ok
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own process group
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(15)
        except ProcessLookupError:
            pass
        try:  # worker processes of the group that outlived their parent
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while self.healthy():  # the port must really be closed before the test goes on
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
