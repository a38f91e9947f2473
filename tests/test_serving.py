"""The registered model serves with MLflow's own server and answers a real HTTP request."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from keras_dl.registry import promote

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(proc, url: str, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"mlflow models serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise AssertionError(f"mlflow models serve did not answer {url} within {timeout:.0f} s")


@pytest.mark.slow
def test_mlflow_serves_the_champion(digits_model, tmp_path):
    uri, result = digits_model
    promote("digits", result.registered_version, "champion", tracking_uri=uri)
    port = _free_port()
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "models",
                "serve",
                "-m",
                "models:/digits@champion",
                "--env-manager",
                "local",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env={
                **os.environ,
                "MLFLOW_TRACKING_URI": uri,
                "TF_CPP_MIN_LOG_LEVEL": "2",
                # The server execs `uvicorn` by name: the venv's bin must be on PATH, as it is in an
                # activated venv.
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the server and its workers stop together
        )
        try:
            _wait_until_up(proc, f"http://127.0.0.1:{port}/ping", tmp_path / "serve.log")
            digits = load_digits()
            body = json.dumps({"inputs": digits.data[:20].tolist()}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/invocations",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as r:
                predictions = np.asarray(json.loads(r.read())["predictions"])
            expected = result.model.predict(digits.data[:20], verbose=0)
            assert predictions.shape == (20, 10)
            np.testing.assert_allclose(predictions, expected, atol=1e-5)
            # A request in the wrong shape is refused with the signature's error, not a crash.
            bad = urllib.request.Request(
                f"http://127.0.0.1:{port}/invocations",
                data=json.dumps({"inputs": [[1.0, 2.0]]}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(bad, timeout=60)
            assert err.value.code == 400
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    assert proc.returncode is not None
