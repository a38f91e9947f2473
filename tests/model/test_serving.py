"""The registered model serves with MLflow's own server and answers a real HTTP request."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.datasets import load_digits

from keras_dl.model.registry import promote
from tests.warm_python import REAL_PYTHON

BIN = Path(REAL_PYTHON).parent


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


@contextlib.contextmanager
def _serving(model_uri: str, tracking_uri: str, tmp_path: Path):
    """``mlflow models serve`` of ``model_uri`` on a free loopback port; yields its base URL.
    The server runs in its own process group, stopped whole on exit."""
    port = _free_port()
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "models",
                "serve",
                "-m",
                model_uri,
                "--env-manager",
                "local",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env={
                **os.environ,
                "MLFLOW_TRACKING_URI": tracking_uri,
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
            yield f"http://127.0.0.1:{port}"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    assert proc.returncode is not None


def _post(url: str, payload) -> urllib.request.Request:
    return urllib.request.Request(
        f"{url}/invocations",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )


@pytest.mark.slow
def test_mlflow_serves_the_champion(digits_model, tmp_path):
    uri, result = digits_model
    promote("digits", result.registered_version, "champion", tracking_uri=uri)
    with _serving("models:/digits@champion", uri, tmp_path) as url:
        digits = load_digits()
        with urllib.request.urlopen(
            _post(url, {"inputs": digits.data[:20].tolist()}), timeout=60
        ) as r:
            predictions = np.asarray(json.loads(r.read())["predictions"])
        expected = result.model.predict(digits.data[:20], verbose=0)
        assert predictions.shape == (20, 10)
        np.testing.assert_allclose(predictions, expected, atol=1e-5)
        # A request in the wrong shape is refused with the signature's error, not a crash.
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(_post(url, {"inputs": [[1.0, 2.0]]}), timeout=60)
        assert err.value.code == 400
        # A null or NaN pixel is refused with a 400 naming the input, not scored.
        for hole in (None, float("nan")):
            row = digits.data[0].tolist()
            row[17] = hole
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(
                    _post(url, {"inputs": [digits.data[1].tolist(), row]}), timeout=60
                )
            assert err.value.code == 400
            message = json.loads(err.value.read())["message"]
            assert (
                "Column 'pixels' has a missing value (null or NaN) in 1 row(s) (row 1)" in message
            )


@pytest.mark.slow
def test_a_table_model_refuses_a_null_feature_and_imputes_an_optional_one(tmp_path):
    """The tabular recipe's model served: a null in a required column is a 400 naming it; a
    null in a column declared optional (model.optional) is filled as at training time."""
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit
    from tests.conftest import write_test_table

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=200), "color": rng.choice(["red", "blue"], 200)})
    frame["kind"] = np.where(frame["x"] > 0, "cat", "dog")
    table = str(tmp_path / "pets")
    write_test_table(table, pa.Table.from_pandas(frame, preserve_index=False), 100)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recipe = load_recipe("tabular")
    sets = [f"data.table={table}", "data.label=kind", f"tracking.uri={uri}", "train.epochs=1",
            f"runtime.run_dir={tmp_path / 'run'}", "train.verbose=0", "model.optional=color"]  # fmt: skip
    fit(resolve(recipe.defaults, sets=sets), recipe)
    with _serving("models:/tabular/1", uri, tmp_path) as url:
        split = {"columns": ["x", "color"], "data": [[0.5, "red"], [None, "blue"]]}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(_post(url, {"dataframe_split": split}), timeout=60)
        assert err.value.code == 400
        message = json.loads(err.value.read())["message"]
        assert "Column 'x' has a missing value (null or NaN) in 1 row(s) (row 1)" in message
        split = {"columns": ["x", "color"], "data": [[0.5, "red"], [-0.5, None]]}
        with urllib.request.urlopen(_post(url, {"dataframe_split": split}), timeout=60) as r:
            predictions = np.asarray(json.loads(r.read())["predictions"])
        assert predictions.shape == (2, 2) and np.isfinite(predictions).all()
